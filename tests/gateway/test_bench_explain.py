"""`prefixscope bench explain` without engines: every kind's generator and ground truth, and the grading table."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from db.ledger import LOST_CAUSES, lost_field
from db.records import MISS_REASONS
from gateway.bench.explain import material
from gateway.bench.explain.conversation import Context, Reply
from gateway.bench.explain.grading import grade, report, table
from gateway.bench.explain.kinds import KINDS, NEW, TENANTS, play
from gateway.bench.explain.layout import Location, divergence, parts, position, within_one_token
from prefixscope.bench_report import emit

ANSWER = "Your order has shipped.\n\nIt arrives soon."
REASONED = '"<think>check the order</think>It has shipped"'
ARGUMENTS = '{"order_id": "4411"}'


class FakeSender:
    """Answers like the engine would (text, a forced tool call, a reasoned JSON string) without waiting."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.sessions: list[str | None] = []
        self.paused: list[float] = []

    def send(self, tenant: str, body: dict[str, Any], session: str | None = None) -> Reply:
        self.sent.append((tenant, body))
        self.sessions.append(session)
        if body.get("tool_choice"):
            call = {"id": "call_1", "type": "function", "function": {"name": "lookup_order", "arguments": ARGUMENTS}}
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
        else:
            message = {"role": "assistant", "content": REASONED if body.get("response_format") else ANSWER}
        return Reply(f"req-{len(self.sent)}", message)

    def pause(self, seconds: float) -> None:
        self.paused.append(seconds)


@pytest.fixture(scope="module")
def played():
    sender = FakeSender()
    context = Context(sender, ttl_s=6.0)
    return sender, context, {case.kind: case for case in play(context)}


def test_every_kind_has_ground_truth(played):
    sender, context, cases = played
    assert {tenant for tenant, _ in sender.sent} <= set(TENANTS)  # each has a key
    assert len(cases) == len(KINDS) >= 15
    for case in cases.values():
        assert case.problem is None, case
        assert case.truth.reason in MISS_REASONS
        assert case.truth.part in (*LOST_CAUSES, NEW)
        assert case.request_id in context.sent
        if case.truth.location.segment != "model":
            assert position(case.body, case.truth.location) is not None, case.kind
    assert {case.truth.reason for case in cases.values()} >= {
        "hit", "volatile_value", "reordered", "system_changed", "tools_changed", "messages_changed",
        "answer_rewritten", "model_changed", "evicted", "expired", "below_page", "routed_away", "new_prefix"}


def test_the_truth_locates_each_injected_change(played):
    _, _, cases = played
    at = {kind: (case.truth.location.segment, case.truth.location.char_offset) for kind, case in cases.items()}
    assert at["next_turn"] == ("messages[2]", len(ANSWER))  # the end of the answer: what follows is new
    assert at["answer_whitespace"] == ("messages[2]", ANSWER.index("\n\n") + 1)
    assert at["answer_truncated"] == ("messages[2]", len(ANSWER) // 2)
    assert at["answer_reasoning_stripped"] == ("messages[2]", 1)
    assert at["shared_prefix"] == ("messages[1]", 0)
    assert at["history_compacted"] == ("messages[1]", 0)
    assert at["below_page"] == ("system", len("You are a helpful bot. "))
    assert at["model_changed"] == ("model", 0)
    stamped = material.STAMPED_SYSTEM.format(stamp=material.stamp(3))
    assert at["volatile_value"] == ("system", stamped.index(":03Z") + 2)
    assert at["system_changed"] == ("system", material.SYSTEM.index("polite"))
    assert at["reordered_tools"][0] == at["tools_changed"][0] == "tools"
    tool_call = '<tool_call>{"name": "lookup_order", "arguments": '
    assert at["tool_arguments"] == ("messages[2]", len(tool_call) + len('{"order_id":'))
    assert at["tool_result_reordered"] == ("messages[3]", 2)
    for kind in ("routed_away", "another_tenant", "new_prefix", "evicted", "expired"):
        assert at[kind] == ("tools", 0)
    assert cases["evicted"].truth.tier == "device"


def test_think_times_stay_below_the_ttl_but_expiry_waits_past_it(played):
    sender, _, _ = played
    assert max(sender.paused) > 6.0  # the expired kind
    assert sorted(sender.paused)[-2] < 6.0  # everything else, the idle turn included


def test_another_tenant_sends_a_prompt_the_first_has_cached_word_for_word(played):
    sender, _, cases = played
    bodies = [body for tenant, body in sender.sent if tenant == "acme"]
    assert cases["another_tenant"].tenant == "stark" and cases["another_tenant"].body in bodies
    assert cases["another_tenant"].truth.reason == "new_prefix"  # tenants are isolated: its own first time


def test_agent_tenants_name_their_conversations_and_the_others_are_linked_by_content(played):
    sender, _, _ = played
    named = {(tenant, session) for (tenant, _), session in zip(sender.sent, sender.sessions, strict=True)}
    assert all(session is not None for tenant, session in named if tenant in ("acme", "globex"))
    assert all(session is None for tenant, session in named if tenant not in ("acme", "globex"))
    acme = [session for (tenant, _), session in zip(sender.sent, sender.sessions, strict=True) if tenant == "acme"]
    assert len(set(acme)) > 10  # one per conversation


def test_locations_compare_as_positions_within_one_token():
    body = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
                         {"role": "assistant", "content": "Hello friend"}, {"role": "user", "content": "Bye"}]}
    truth = Location("messages[2]", len("Hello friend"))
    assert within_one_token(body, truth, Location("messages[3]", 0))  # the same place: only template between
    assert within_one_token(body, truth, Location("messages[2]", len("Hello")))  # one token (" friend") before
    assert not within_one_token(body, truth, Location("messages[2]", 0))
    assert not within_one_token(body, truth, None)
    assert [p[0] for p in parts(body)] == ["system", "messages[1]", "messages[2]", "messages[3]"]
    assert divergence(body, body) == Location("messages[3]", 3)


def _row(case, reason: str | None = None, segment: str | None = None, offset: int | None = None,
         **ledger: int) -> dict[str, Any]:
    truth = case.truth
    row = {"id": case.request_id, "miss_reason": reason or truth.reason,
           "divergence_segment": segment or truth.location.segment,
           "divergence_char_offset": truth.location.char_offset if offset is None else offset,
           "prompt_tokens": 100, "cached_tokens": 40, "cached_tokens_device": 40, "cached_tokens_host": 0,
           "cached_tokens_disk": 0, "new_tokens": 10, "unknown_tokens": 0, "evicted_tier": truth.tier}
    lost = {cause: 0 for cause in LOST_CAUSES}
    lost["page_alignment"] = 5
    if truth.part == NEW:
        row["new_tokens"] = 55
    else:
        lost[truth.part] += 45
    lost.update(ledger)
    row.update({lost_field(cause): tokens for cause, tokens in lost.items()})
    return row


def test_a_row_matching_its_truth_is_right_and_each_wrong_part_is_told(played):
    _, _, cases = played
    case = cases["answer_whitespace"]
    assert grade(case, _row(case))["right"]
    wrong_reason = grade(case, _row(case, reason="hit"))
    assert not wrong_reason["right"] and not wrong_reason["reason_right"] and wrong_reason["location_right"]
    far = grade(case, _row(case, offset=0))
    assert not far["location_right"] and far["reason_right"]
    other_cause = grade(case, _row(case, answer_rewritten=0, messages_changed=45))
    assert not other_cause["ledger_right"]
    not_adding_up = grade(case, _row(case, page_alignment=6))
    assert not not_adding_up["ledger_right"]
    assert not grade(case, None)["right"]
    evicted = cases["evicted"]
    assert not grade(evicted, {**_row(evicted), "evicted_tier": "host"})["ledger_right"]


def test_the_report_passes_only_when_every_kind_is_right_and_every_ledger_exact(played):
    _, _, cases = played
    ordered = list(cases.values())
    rows = {case.request_id: _row(case) for case in ordered}
    document = report(ordered, rows, rows.values())
    assert document["pass"] and document["verdicts"]["ledgers_exact"]["measured"] == 1.0
    out, err = io.StringIO(), io.StringIO()
    assert emit(document, out, err) == 0 and json.loads(out.getvalue())["pass"]
    assert "ledgers exact: 22/22 rows (100%)" in table(document)

    unrecorded = {**rows, ordered[0].request_id: {**rows[ordered[0].request_id], "unknown_tokens": None}}
    failing = report(ordered, unrecorded, unrecorded.values())
    assert not failing["pass"] and failing["verdicts"]["ledgers_exact"]["exact"] == len(rows) - 1
    assert emit(failing, io.StringIO(), err) == 1 and "FAIL kinds_right" in err.getvalue()


def test_a_kind_that_cannot_be_played_fails_alone():
    class Refusing(FakeSender):
        def send(self, tenant: str, body: dict[str, Any], session: str | None = None) -> Reply:
            if body.get("tool_choice"):
                raise RuntimeError("the gateway answered 400")
            return super().send(tenant, body, session)

    cases = play(Context(Refusing(), ttl_s=6.0), ["tool_arguments", "next_turn"])
    assert cases[0].problem and "400" in cases[0].problem and cases[1].problem is None
    document = report(cases, {}, [])
    assert not document["pass"] and "could not be played" in table(document)
