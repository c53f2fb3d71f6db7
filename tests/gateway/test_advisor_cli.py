"""`prefixscope advise`: per tenant and candidate, sample size, hit rates, savings, what it changes and the lines to
enable it, as text and JSON, from a real SQLite database."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from db.advice import AdviceOutcome
from db.engine import create_sync_engine_for
from db.migrate import upgrade
from db.records import RequestRecord
from db.store import store_records
from db.timeutil import utc_now
from prefixscope.cli import main

END = "hoist_volatile:end"


def _record(index: int, tenant: str, advice: tuple[AdviceOutcome, ...], cached: int) -> RequestRecord:
    return RequestRecord(
        request_id=f"{tenant}-{index}",
        created_at=utc_now() - timedelta(minutes=5),
        tenant=tenant,
        key_id=None,
        endpoint="chat.completions",
        model="m",
        upstream="engine",
        stream=False,
        status_code=200,
        error_type=None,
        prompt_tokens=1000,
        cached_tokens=cached,
        completion_tokens=1,
        ttft_ms=100.0,
        latency_ms=120.0,
        advice=advice,
    )


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/advice.db"
    upgrade(url)
    records = [_record(i, "agents", (AdviceOutcome(END, 1000, 900, True),), 100) for i in range(10)]
    records += [_record(i, "steady", (AdviceOutcome(END, 1000, 800, False),), 800) for i in range(4)]
    engine = create_sync_engine_for(url)
    with engine.begin() as conn:
        store_records(conn, records)
    engine.dispose()
    return url


def test_advise_prints_each_tenant_and_candidate(database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", "--database-url", database_url]) == 0
    out = capsys.readouterr().out
    agents, steady, *others = out.split("\n\n")
    # Retention advice and the fleet patterns follow the rule advice.
    assert others[-1].startswith("fleet patterns")
    assert agents.splitlines()[0].startswith(
        "tenant agents: token hit rate 10.0% over the last 1d (on 10 requests sampled under its current settings)"
    )
    assert "  -> turn on hoist_volatile (placement end): estimated 90.0% (from 10 samples)" in agents
    assert "[RECOMMENDED] - 10 sampled requests" in agents
    assert "moves dates, times and ids from the system prompt to a short note at the end" in agents
    assert "(moves content: changes what the model reads)" in agents
    # Per day: the range is a day and an hour's start; 10 000 prompt tokens, 80% of them no longer prefilled.
    assert "saves per day: " in agents and "of prefill" in agents
    assert '      [tenants.agents]\n      rules = { hoist_volatile = true }\n      hoist_placement = "end"' in agents
    assert "[not enough samples] - 4 sampled requests" in steady
    # Four samples say nothing either way: no claim that no rule would help.
    assert "nothing to recommend" not in steady
    assert "not enough sampled requests yet to advise: 4 of the 10 an estimate needs; 6 more requests" in steady


def test_advise_with_enough_samples_and_no_gain_says_nothing_to_recommend(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["advise", "--database-url", database_url, "--tenant", "steady", "--min-samples", "4"]) == 0
    out = capsys.readouterr().out
    assert "nothing to recommend" in out and "not enough sampled requests yet" not in out
    # No gain: no "saves per day" figure, and never a negative one.
    assert "    saves per day: nothing" in out and "-" not in out.split("saves per day:")[1].splitlines()[0]


def test_advise_labels_today_with_the_queried_range(database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", "--database-url", database_url, "--tenant", "agents", "--since", "7d"]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert head.startswith("tenant agents: token hit rate 10.0% over the last 7d (on 10 requests sampled")
    assert " today" not in head


def test_advise_json_hides_estimates_below_the_minimum(database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", "--database-url", database_url, "--json", "--tenant", "steady"]) == 0
    (steady,) = json.loads(capsys.readouterr().out)["rules"]
    (candidate,) = steady["candidates"]
    assert candidate["samples"] == 4 and candidate["shown"] is False and candidate["estimated_hit_rate"] is None
    assert main(["advise", "--database-url", database_url, "--json", "--min-samples", "4"]) == 0
    agents, steady = json.loads(capsys.readouterr().out)["rules"]
    (end,) = agents["candidates"]
    assert end["estimated_hit_rate"] == pytest.approx(0.9) and end["recommended"] is True
    assert end["toml"] == '[tenants.agents]\nrules = { hoist_volatile = true }\nhoist_placement = "end"'
    assert end["tokens_saved_per_day"] == pytest.approx(10000 / steady["days"] * 0.8)
    # 100 ms of TTFT per 900 prefilled tokens.
    assert end["prefill_ms_saved_per_day"] == pytest.approx(end["tokens_saved_per_day"] * 100 / 900)
    assert steady["candidates"][0]["recommended"] is False
    assert steady["candidates"][0]["estimated_hit_rate"] == pytest.approx(0.8)


def test_advise_refuses_a_bad_minimum(database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", "--database-url", database_url, "--min-samples", "0"]) == 2
    assert "--min-samples" in capsys.readouterr().err


def test_advise_on_a_fresh_machine_says_what_to_run_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path}/missing.db"
    assert main(["advise", "--database-url", url]) == 2
    err = capsys.readouterr().err
    assert "no database at" in err and "prefixscope db upgrade" in err and "Traceback" not in err
    assert not (tmp_path / "missing.db").exists()
    (tmp_path / "empty.db").touch()
    assert main(["advise", "--database-url", f"sqlite:///{tmp_path}/empty.db", "--json"]) == 2
    captured = capsys.readouterr()
    assert "has no prefixscope tables" in captured.err and captured.out == ""


def test_advise_says_to_merge_the_lines_into_an_existing_tenant_table(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Appending `[tenants.agents]` to a file that already declares it makes the file fail to load: the advice says
    to merge."""
    import tomllib

    assert main(["advise", "--database-url", database_url, "--tenant", "agents"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "to enable it" in line)
    assert "merge into the tenant's table and rules if the file has them" in header
    with pytest.raises(tomllib.TOMLDecodeError):  # what happens to a user who pastes without merging
        tomllib.loads("[tenants.agents]\nstore_prompt_text = false\n[tenants.agents]\nhoist_volatile = true\n")


def test_advise_for_an_unknown_tenant_names_it(database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", "--database-url", database_url, "--tenant", "agnets"]) == 0
    out = capsys.readouterr().out
    assert "no rule advice for tenant 'agnets'" in out and "check the name" in out


def test_a_candidate_with_no_gain_gets_no_turn_on_line(database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", "--database-url", database_url, "--tenant", "steady", "--min-samples", "4"]) == 0
    rules = capsys.readouterr().out.split("\n\n")[0]
    assert "[no gain]" in rules and "nothing to recommend" in rules
    assert "  -> " not in rules


def test_per_day_figures_divide_by_whole_days_or_say_they_are_extrapolated(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # 10 requests of 1000 prompt tokens within the last day: 10.0k per day, not 9.6k over a range widened to hours.
    assert main(["advise", "--database-url", database_url, "--tenant", "agents", "--json"]) == 0
    (agents,) = json.loads(capsys.readouterr().out)["rules"]
    assert agents["days"] == 1.0 and agents["prompt_tokens_per_day"] == 10_000
    assert main(["advise", "--database-url", database_url, "--tenant", "agents"]) == 0
    assert "10.0k prompt tokens per day\n" in capsys.readouterr().out
    assert main(["advise", "--database-url", database_url, "--tenant", "agents", "--since", "1h"]) == 0
    out = capsys.readouterr().out
    head = out.splitlines()[0]
    assert "prompt tokens per day (extrapolated to a day from a " in head and " h range)" in head
    saves = next(line for line in out.splitlines() if "saves per day:" in line)
    assert "(extrapolated to a day from a " in saves


def test_fleet_patterns_read_like_the_other_counts() -> None:
    from db.patterns.finder import FleetPattern
    from gateway.advisor.retention_report import format_patterns

    one = FleetPattern("span", 12, 1, 12, "system", 358, 375.0, 4500, "hoist it")
    two = FleetPattern("span", 12, 2, 12, "system", 1200, 12.0, 144, "hoist it")
    text = format_patterns([one, two])
    assert "12 requests from 1 tenant, 12 variants, at system; costs 4.5k tokens (375 per affected request), " \
           "358 tokens otherwise shared" in text
    assert "from 2 tenants," in text and "1.2k tokens otherwise shared" in text and "tenant(s)" not in text
