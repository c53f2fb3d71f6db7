"""Reuse by retention class and tier: generated request rows (with and without the token ledger) give each prefix's
reads per tier and entries lost to eviction (by tier) and expiry (by class); an observed eviction ends the entry in
the advisor's replay and in the what-if simulator alike; held capacity is priced per tier."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from db.chains import RequestChain
from db.engine import create_sync_engine_for
from db.queries.retention import load_prefix_uses, retention_advice
from db.records import RequestRecord
from db.retention.advice import PrefixUses, advise_prefix
from db.retention.costs import CostModel, PriceError
from db.retention.replay import replay_class
from db.retention.reuse import EntryLosses, PrefixReuse, TierReads
from db.simulation.retention import replay_retention
from db.store import store_records
from prefixscope.cli import main
from .retention_testkit import stored_advice, trace_of

BASE_TIME = datetime(2025, 3, 10, 12, 0, tzinfo=UTC)
LOCAL = CostModel.for_kind("local_engine")
TIERS = ("device", "host", "disk")


def _generated(rng: random.Random, make_record: Callable[..., RequestRecord]) -> tuple[list[RequestRecord], dict]:
    """Rows of two prefixes, each request one of: a read split by tier, a read with no tier split, an eviction (with
    a ledger: tokens and tier; without: `miss_kind` only), an expiry (likewise, with its class and idle time), a
    cold write. Returns the rows and, per prefix, the figures expected."""
    records = []
    expected: dict[str, dict[str, Any]] = {}
    for prefix in ("p1", "p2"):
        reads: dict[str, list[int]] = {}
        evicted: dict[str, list[int]] = {}
        expired: dict[str, list[Any]] = {}
        since_loss = 0
        for i in range(60):
            kind = rng.choice(("tiers", "untiered", "evicted", "evicted_nl", "expired", "expired_nl", "cold"))
            fields: dict[str, Any] = {"prompt_tokens": 400, "cached_tokens": 0}
            if kind == "tiers":
                split = {tier: rng.choice((0, 16, 64)) for tier in TIERS}
                split["device"] += 16
                fields |= {f"cached_tokens_{t}": n for t, n in split.items()} | {"cached_tokens": sum(split.values())}
                for tier, tokens in split.items():
                    if tokens:
                        counts = reads.setdefault(tier, [0, 0])
                        counts[0] += 1
                        counts[1] += tokens
            elif kind == "untiered":
                fields["cached_tokens"] = 128
                counts = reads.setdefault("unreported", [0, 0])
                counts[0] += 1
                counts[1] += 128
            elif kind.startswith("evicted"):
                ledger = kind == "evicted"
                tier = rng.choice(TIERS) if ledger else "unknown"
                lost = rng.choice((32, 96)) if ledger else 0
                fields |= {"miss_kind": "evicted"}
                if ledger:
                    fields |= {"lost_evicted_tokens": lost, "lost_expired_tokens": 0, "evicted_tier": tier,
                               "new_tokens": 400 - lost, "unknown_tokens": 0}
                group = evicted.setdefault(tier, [0, 0, 0])
                group[0] += 1
                group[1] += lost
                group[2] += since_loss
                since_loss = 0
            elif kind.startswith("expired"):
                ledger = kind == "expired"
                retention = rng.choice(("5m", "1h", None))
                idle = rng.choice((301.0, 900.0, None))
                lost = 48 if ledger else 0
                fields |= {"miss_kind": "expired", "retention_class": retention, "idle_s": idle}
                if ledger:
                    fields |= {"lost_expired_tokens": lost, "lost_evicted_tokens": 0, "new_tokens": 400 - lost,
                               "unknown_tokens": 0}
                group = expired.setdefault(retention or "default", [0, 0, 0, []])
                group[0] += 1
                group[1] += lost
                group[2] += since_loss
                group[3] += [] if idle is None else [idle]
                since_loss = 0
            else:
                # A ledger that says nothing was lost, though the engine's kind says evicted: the ledger wins.
                fields |= {"miss_kind": "evicted", "lost_evicted_tokens": 0, "new_tokens": 400, "unknown_tokens": 0}
            since_loss += 1 if fields["cached_tokens"] else 0
            records.append(make_record(created_at=BASE_TIME + timedelta(seconds=30 * i + (prefix == "p2")),
                                       prefix_hash=prefix, **fields))
        expected[prefix] = {
            "reads": tuple(TierReads(t, *reads[t]) for t in (*TIERS, "unreported") if t in reads),
            "evicted": tuple(EntryLosses(t, *evicted[t]) for t in (*TIERS, "unknown") if t in evicted),
            "expired": tuple(
                EntryLosses(c, n, tokens, before, sorted(idle)[len(idle) // 2] if idle else None)
                for c, (n, tokens, before, idle) in sorted(expired.items())
            ),
        }
    return records, expected


def test_reuse_by_tier_and_class_from_generated_rows(
    db_url: str, make_record: Callable[..., RequestRecord], capsys: pytest.CaptureFixture[str]
) -> None:
    records, expected = _generated(random.Random(21), make_record)
    engine = create_sync_engine_for(db_url)
    try:
        with engine.begin() as conn:
            store_records(conn, records)
        with engine.connect() as conn:
            (items,) = load_prefix_uses(conn, BASE_TIME).values()
            (advice,) = retention_advice(conn, BASE_TIME, lambda _: LOCAL, until=BASE_TIME + timedelta(hours=1))
    finally:
        engine.dispose()
    for uses, _ in items:
        want = expected[uses.prefix_hash]
        assert uses.reuse == PrefixReuse(want["reads"], want["evicted"], want["expired"])
        rows = [r for r in records if r.prefix_hash == uses.prefix_hash]
        assert uses.evicted == tuple(
            i for i, r in enumerate(rows)
            if (r.lost_evicted_tokens or 0) > 0 or (r.lost_evicted_tokens is None and r.miss_kind == "evicted")
        )
    assert {p.prefix_hash: p.reuse for p in advice.prefixes} == {u.prefix_hash: u.reuse for u, _ in items}

    assert main(["advise", "--database-url", db_url, "--since", BASE_TIME.isoformat(), "--json"]) == 0
    (tenant,) = json.loads(capsys.readouterr().out)["retention"]
    p1 = next(p for p in tenant["prefixes"] if p["prefix_hash"] == "p1")
    assert p1["reuse"]["evicted"][0] == {
        "key": expected["p1"]["evicted"][0].key, "count": expected["p1"]["evicted"][0].count,
        "tokens": expected["p1"]["evicted"][0].tokens, "reads_before": expected["p1"]["evicted"][0].reads_before,
        "median_idle_s": None,
    }
    assert main(["advise", "--database-url", db_url, "--since", BASE_TIME.isoformat()]) == 0
    out = capsys.readouterr().out
    device = next(r for r in expected["p1"]["reads"] if r.tier == "device")
    assert f"reads by tier: device {device.requests} (" in out
    assert "evicted from: device " in out and "expired by class: " in out


def test_an_observed_eviction_ends_the_entry() -> None:
    # Uses every minute; the third found its entry evicted: under every class it writes, held until then.
    times = (0.0, 60.0, 120.0, 180.0)
    for retention in ("5m", "1h", "persistent"):
        outcome = replay_class(times, 100, retention, LOCAL, evicted={2})
        assert (outcome.hits, outcome.writes, outcome.evictions) == (2, 2, 1)
        assert outcome.held_token_s == 100 * (120.0 + 60.0)
        assert outcome.unread_writes == 0
    # Had it expired anyway (5m over a 10-minute gap), the use is a write, not an eviction before the TTL.
    outcome = replay_class((0.0, 600.0), 100, "5m", LOCAL, evicted={1})
    assert (outcome.hits, outcome.writes, outcome.evictions) == (0, 2, 0)
    assert replay_class((0.0, 600.0), 100, "1h", LOCAL, evicted={1}).evictions == 1


def test_a_prefix_evicted_before_its_ttl_is_told_to_add_capacity_not_a_longer_class() -> None:
    times = tuple(i * 120.0 for i in range(30))
    reuse = PrefixReuse((TierReads("device", 15, 15 * 512),), (EntryLosses("device", 15, 15 * 512, 15),))
    uses = PrefixUses("acme", "p", 512, times, "5m", "", evicted=tuple(range(1, 30, 2)), reuse=reuse)
    advice = advise_prefix(uses, LOCAL, 1.0)
    assert advice.best.retention == advice.today == "5m"
    assert advice.today_outcome.evictions == 15
    # Every class gets the same reads; the longer ones only hold the entries longer.
    assert len({o.hits for o in advice.outcomes if o.retention != "none"}) == 1
    assert advice.action == ("keep today's class (5m): no class saves more; evicted from device 15 times before its "
                             "TTL (5m): a longer class buys nothing; add host tier capacity (or device memory)")
    assert advice.reuse == reuse


def test_held_capacity_is_priced_per_tier() -> None:
    assert LOCAL.held_ms_per_token_hour == {"device": 0.5, "host": 0.1, "disk": 0.01}
    assert LOCAL.held_price() == 0.5
    assert LOCAL.held_price({"device": 100, "host": 300}) == pytest.approx((0.5 * 100 + 0.1 * 300) / 400)
    every = CostModel.for_kind("local_engine", {"held_ms_per_token_hour_disk": 0.2, "held_ms_per_token_hour": 2.0})
    assert every.held_ms_per_token_hour == {"device": 2.0, "host": 2.0, "disk": 0.2}
    with pytest.raises(PriceError, match="held_ms_per_token_hour_host"):
        CostModel.for_kind("local_engine", {"held_ms_per_token_hour_gpu": 1.0})
    with pytest.raises(PriceError, match="unknown cache price"):
        CostModel.for_kind("anthropic", {"held_ms_per_token_hour_host": 1.0})
    # The same uses cost less capacity when their reads came from host memory.
    times = (0.0, 1800.0)
    on_device = advise_prefix(PrefixUses("a", "p", 1000, times, "1h", ""), LOCAL, 1.0)
    on_host = advise_prefix(
        PrefixUses("a", "p", 1000, times, "1h", "", reuse=PrefixReuse((TierReads("host", 1, 1000),))), LOCAL, 1.0
    )
    held_hours = 1000 * 1800.0 / 3600
    assert on_device.today_outcome.saving == pytest.approx(1000 * 0.5 - held_hours * 0.5)
    assert on_host.today_outcome.saving == pytest.approx(1000 * 0.5 - held_hours * 0.1)


def test_advice_and_simulator_agree_with_observed_evictions(
    db_url: str, make_record: Callable[..., RequestRecord], capsys: pytest.CaptureFixture[str]
) -> None:
    """A prefix used every 3 minutes and one every 20, each request its prefix's blocks then its own; a third of the
    uses found the prefix evicted from the device pool (ledger rows), and some older rows say so by `miss_kind`."""
    block = 16
    prefixes = {"every_3m": (180.0, tuple(range(1000, 1040))), "every_20m": (1200.0, tuple(range(2000, 2020)))}
    records = []
    unique = 10**6
    for name, (gap, blocks) in prefixes.items():
        for i in range(int(6 * 3600 / gap)):
            unique += 1
            hashes = (*blocks, unique)
            chain = RequestChain(block, len(hashes) * block, hashes)
            fields: dict[str, Any] = {}
            if i % 3 == 2:
                fields = ({"lost_evicted_tokens": len(blocks) * block, "evicted_tier": "device", "new_tokens": block,
                           "unknown_tokens": 0, "miss_kind": "evicted"} if i % 2 else {"miss_kind": "evicted"})
            records.append(make_record(created_at=BASE_TIME + timedelta(seconds=i * gap), prefix_hash=name,
                                       chain=chain, prompt_tokens=chain.input_length, **fields))
    records.sort(key=lambda r: r.created_at)
    advice = stored_advice(db_url, records, LOCAL, BASE_TIME, BASE_TIME + timedelta(hours=6))
    trace = trace_of(records, BASE_TIME, block)
    by_name = {p.prefix_hash: p for p in advice.prefixes}
    assert by_name["every_3m"].prefix_tokens == 40 * block
    for retention in ("none", "5m", "1h", "persistent"):
        simulated = replay_retention(trace, lambda _: retention)
        for name, prefix in by_name.items():
            outcome = next(o for o in prefix.outcomes if o.retention == retention)
            assert simulated.prefixes[name].hit_tokens == outcome.hit_tokens, (retention, name)
            assert simulated.prefixes[name].writes == outcome.writes, (retention, name)
    # Evicted every third use: under 5m the 3-minute prefix loses 39 of its reads; 1h reads the 20-minute one
    # except where it was evicted.
    assert by_name["every_3m"].outcomes[1].evictions == 40 and by_name["every_3m"].outcomes[1].hits == 79
    assert by_name["every_20m"].outcomes[2].hits == 18 - 1 - 6
    assert by_name["every_3m"].action.endswith(
        "; evicted from device 40 times though kept persistently: add host tier capacity (or device memory)")
    losses = Counter(loss.key for loss in by_name["every_3m"].reuse.evicted for _ in range(loss.count))
    assert losses == {"device": 20, "unknown": 20}

    # `prefixscope simulate --retention` reads the same evictions from the stored rows.
    argv = ["simulate", "--database-url", db_url, "--since", BASE_TIME.isoformat(), "--retention", "5m,1h", "--json"]
    assert main(argv) == 0
    rows = {row["retention"]: row for row in json.loads(capsys.readouterr().out)["retention"]}
    for retention in ("5m", "1h"):
        assert rows[retention]["hit_tokens"] == sum(
            next(o for o in p.outcomes if o.retention == retention).hit_tokens for p in by_name.values()
        )
