"""The table: each kind's recorded row against its truth, and the share of recorded rows whose ledger adds up.

A kind is right when the recorded miss reason is the truth's, the recorded location lies within one token of the
truth's (`layout.within_one_token`), the ledger carries the tokens the cache could not serve in the truth's part (no
other lost cause holds any, `page_alignment` aside; a lost cause holds some, or `new` does), and for an eviction the
recorded tier is the truth's. Rows are mappings of `requests` columns (`db.records.RequestRecord` field names).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import SimpleNamespace
from typing import Any

from db.ledger import LOST_CAUSES, TokenLedger, lost_field
from gateway.bench.explain.kinds import NEW, Case
from gateway.bench.explain.layout import Location, within_one_token

PAGE_ALIGNMENT = "page_alignment"


def ledger_of(row: Mapping[str, Any]) -> TokenLedger | None:
    """The ledger a stored row holds (None when it holds none)."""
    try:
        return TokenLedger.of(SimpleNamespace(**row))
    except (AttributeError, TypeError):
        return None


def ledger_exact(row: Mapping[str, Any]) -> bool:
    ledger = ledger_of(row)
    return ledger is not None and ledger.adds_up()


def _part_right(row: Mapping[str, Any], part: str) -> bool:
    if not ledger_exact(row):
        return False
    lost = {cause: row.get(lost_field(cause)) or 0 for cause in LOST_CAUSES}
    others = [tokens for cause, tokens in lost.items() if cause not in (part, PAGE_ALIGNMENT)]
    if any(others):
        return False
    if part == NEW:
        return (row.get("new_tokens") or 0) > 0
    return lost.get(part, 0) > 0


def _ledger_summary(row: Mapping[str, Any]) -> dict[str, Any]:
    lost = {cause: row.get(lost_field(cause)) for cause in LOST_CAUSES if row.get(lost_field(cause))}
    return {"prompt": row.get("prompt_tokens"), "cached": row.get("cached_tokens"), "new": row.get("new_tokens"),
            "lost": lost, "unknown": row.get("unknown_tokens")}


def grade(case: Case, row: Mapping[str, Any] | None) -> dict[str, Any]:
    """One line of the table: the truth, what was recorded and whether each part is right."""
    truth = case.truth
    line: dict[str, Any] = {
        "kind": case.kind,
        "tenant": case.tenant,
        "request_id": case.request_id,
        "truth": {"reason": truth.reason, "segment": truth.location.segment, "offset": truth.location.char_offset,
                  "ledger_part": truth.part, **({"tier": truth.tier} if truth.tier else {})},
    }
    if case.problem:
        line["problem"] = case.problem
    if row is None:
        return {**line, "recorded": None, "reason_right": False, "location_right": False, "ledger_right": False,
                "right": False}
    recorded_location = None
    if row.get("divergence_segment") is not None and row.get("divergence_char_offset") is not None:
        recorded_location = Location(row["divergence_segment"], int(row["divergence_char_offset"]))
    line["recorded"] = {
        "reason": row.get("miss_reason"), "segment": row.get("divergence_segment"),
        "offset": row.get("divergence_char_offset"), "miss_kind": row.get("miss_kind"),
        "replica": row.get("replica"), "evicted_tier": row.get("evicted_tier"),
        "answer_rewrite": row.get("answer_rewrite"), "turn_index": row.get("turn_index"), "idle_s": row.get("idle_s"),
        "ledger": _ledger_summary(row),
    }
    reason_right = row.get("miss_reason") == truth.reason
    location_right = within_one_token(case.body, truth.location, recorded_location)
    ledger_right = _part_right(row, truth.part) and (truth.tier is None or row.get("evicted_tier") == truth.tier)
    right = reason_right and location_right and ledger_right and not case.problem
    return {**line, "reason_right": reason_right, "location_right": location_right, "ledger_right": ledger_right,
            "right": right}


def report(cases: list[Case], rows: Mapping[str, Mapping[str, Any]], all_rows: Iterable[Mapping[str, Any]],
           min_kinds: int = 15) -> dict[str, Any]:
    """The benchmark's document: per-kind lines, the ledger share over `all_rows` and the verdicts (every kind
    right, every location within one token, every ledger exact, at least `min_kinds` kinds)."""
    lines = [grade(case, rows.get(case.request_id)) for case in cases]
    every_row = list(all_rows)
    exact = sum(1 for row in every_row if ledger_exact(row))
    share = round(exact / len(every_row), 4) if every_row else 0.0
    right = sum(1 for line in lines if line["right"])
    located = sum(1 for line in lines if line["location_right"])
    verdicts = {
        "kinds": {"measured": len(lines), "target": f">= {min_kinds}", "pass": len(lines) >= min_kinds},
        "kinds_right": {"measured": f"{right}/{len(lines)}", "target": "all", "pass": right == len(lines)},
        "locations_within_one_token": {"measured": f"{located}/{len(lines)}", "target": "all",
                                       "pass": located == len(lines)},
        "ledgers_exact": {"measured": share, "target": 1.0, "rows": len(every_row), "exact": exact,
                          "pass": bool(every_row) and exact == len(every_row)},
    }
    return {"kinds": lines, "verdicts": verdicts, "pass": all(v["pass"] for v in verdicts.values())}


def _ledger_text(ledger: Mapping[str, Any] | None) -> str:
    """`prompt=270 cached=240 new=20 page_alignment=10`, the recorded ledger in one line ("-" for a NULL part)."""
    if not ledger:
        return ""
    parts = [f"{name}={'-' if ledger.get(name) is None else ledger[name]}" for name in ("prompt", "cached", "new")]
    parts += [f"{cause}={tokens}" for cause, tokens in (ledger.get("lost") or {}).items()]
    if ledger.get("unknown"):
        parts.append(f"unknown={ledger['unknown']}")
    return " ".join(parts)


def table(document: Mapping[str, Any]) -> str:
    """The per-kind table a person reads: truth against recorded, and right/wrong."""
    header = f"{'kind':26} {'truth':48} {'recorded':36} reason loc ledger  recorded ledger"
    out = [header, "-" * len(header)]
    for line in document["kinds"]:
        truth = line["truth"]
        got = line.get("recorded") or {}
        truth_text = f"{truth['reason']} {truth['segment']}@{truth['offset']} [{truth['ledger_part']}]"
        got_text = f"{got.get('reason')} {got.get('segment')}@{got.get('offset')}" if got else "(no row)"
        marks = " ".join("ok " if line[key] else "NO " for key in ("reason_right", "location_right", "ledger_right"))
        note = f"  ({line['problem']})" if line.get("problem") else f"  {_ledger_text(got.get('ledger'))}"
        out.append(f"{line['kind']:26} {truth_text:48} {got_text:36} {marks}{note}")
    ledgers = document["verdicts"]["ledgers_exact"]
    out.append(f"ledgers exact: {ledgers['exact']}/{ledgers['rows']} rows ({ledgers['measured']:.0%})")
    return "\n".join(out)
