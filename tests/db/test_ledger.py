"""The token ledger as a value: its parts add up, it round-trips through a record, unknown stays unknown."""

from __future__ import annotations

from collections.abc import Callable

from db.ledger import LOST_CAUSES, TokenLedger, eligible_hit_rate, lost_field
from db.records import RequestRecord


def test_every_lost_cause_has_its_record_field() -> None:
    names = set(RequestRecord.__dataclass_fields__)
    assert {lost_field(cause) for cause in LOST_CAUSES} <= names


def test_a_ledger_round_trips_through_the_record(make_record: Callable[..., RequestRecord]) -> None:
    ledger = TokenLedger(
        prompt_tokens=100,
        cached_tokens=64,
        cached_by_tier={"device": 48, "host": 16, "disk": 0},
        new_tokens=20,
        lost={"page_alignment": 7, "answer_rewritten": 9},
    )
    assert ledger.adds_up()
    record = make_record(
        prompt_tokens=100, cached_tokens=64, cached_tokens_device=48, cached_tokens_host=16, cached_tokens_disk=0,
        **ledger.record_fields(),
    )
    assert TokenLedger.of(record) == ledger
    assert ledger.eligible_hit_rate == 64 / 80


def test_parts_that_do_not_add_up_are_refused() -> None:
    assert not TokenLedger(prompt_tokens=100, cached_tokens=64, new_tokens=20).adds_up()
    assert not TokenLedger(prompt_tokens=10, cached_tokens=12, new_tokens=-2).adds_up()
    split = {"device": 10, "host": 0, "disk": 0}
    assert not TokenLedger(prompt_tokens=30, cached_tokens=20, cached_by_tier=split, new_tokens=10).adds_up()


def test_unknown_cached_tokens_leave_every_part_unknown(make_record: Callable[..., RequestRecord]) -> None:
    ledger = TokenLedger(prompt_tokens=50, unknown_tokens=50)
    fields = ledger.record_fields()
    assert fields["new_tokens"] is None and all(fields[lost_field(cause)] is None for cause in LOST_CAUSES)
    record = make_record(prompt_tokens=50, cached_tokens=None, **fields)
    assert TokenLedger.of(record) == ledger and ledger.adds_up()
    assert ledger.eligible_hit_rate is None
    assert TokenLedger.of(make_record(prompt_tokens=50)) is None  # a record without a ledger


def test_eligible_hit_rate_leaves_out_the_new_turn() -> None:
    assert eligible_hit_rate(cached=800, prompt=1000, new=200) == 1.0
    assert eligible_hit_rate(cached=None, prompt=1000, new=0) is None
    assert eligible_hit_rate(cached=0, prompt=100, new=100) is None  # nothing was eligible
