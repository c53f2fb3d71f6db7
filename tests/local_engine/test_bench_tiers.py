"""`prefixscope bench tiers`: the command is wired, and its verdicts read the figures the way its targets say."""

from __future__ import annotations

import json

import pytest

from local_engine.bench.tiers import shared_prefix_tokens, verdicts
from prefixscope.cli import build_parser, main
from prefixscope.progress import ENV_INTERVAL_S, ENV_PROGRESS


def test_the_command_is_registered_with_its_options():
    args = build_parser().parse_args(["bench", "tiers", "--device", "cpu", "--prefix-tokens", "512", "--repeats", "2",
                                      "--model", "smollm2"])
    assert (args.device, args.prefix_tokens, args.repeats, args.model) == ("cpu", 512, 2, "smollm2")
    defaults = build_parser().parse_args(["bench", "tiers"])
    assert defaults.prefix_tokens == 2048 and callable(defaults.handler)


def test_the_shared_prefix_is_the_common_leading_run():
    assert shared_prefix_tokens((1, 2, 3, 4), (1, 2, 5)) == 2
    assert shared_prefix_tokens((1, 2), (1, 2, 3)) == 2
    assert shared_prefix_tokens((7,), (1,)) == 0


def test_verdicts_compare_l2_with_l1_l3_with_the_miss_and_the_restart_share():
    passing = verdicts({"miss": 1000.0, "device": 40.0, "host": 60.0, "disk": 250.0}, 0.95)
    assert all(v["pass"] for v in passing.values())
    assert passing["l2_hit_ttft_over_l1_hit_ttft_p50"]["value"] == 1.5
    assert passing["l3_hit_ttft_over_miss_ttft_p50"]["value"] == 0.25
    failing = verdicts({"miss": 1000.0, "device": 40.0, "host": 61.0, "disk": 251.0}, 0.949)
    assert not any(v["pass"] for v in failing.values())


def test_a_run_on_a_small_model_serves_each_tier_and_prints_one_json_document(tiny_loaded, tmp_path, capsys,
                                                                            monkeypatch):
    tiny_loaded.model.save_pretrained(tmp_path / "tiny")
    tiny_loaded.tokenizer.save_pretrained(tmp_path / "tiny")
    monkeypatch.setenv(ENV_PROGRESS, "lines")
    monkeypatch.setenv(ENV_INTERVAL_S, "0")
    code = main(["bench", "tiers", "--model", str(tmp_path / "tiny"), "--device", "cpu", "--prefix-tokens", "256",
                 "--repeats", "2"])
    out, err = capsys.readouterr()
    assert code == 0
    report = json.loads(out)  # stdout holds the JSON document alone
    by_tier = report["by_tier"]
    assert by_tier["miss"]["tier_tokens_mean"]["device"] < 50  # only the template opening and the first words
    assert by_tier["device"]["tier_tokens_mean"]["device"] >= report["workload"]["prefix_tokens"]
    assert by_tier["host"]["tier_tokens_mean"]["host"] > 0 and report["load_ms_p50"]["host"] > 0
    assert by_tier["disk"]["tier_tokens_mean"]["disk"] >= report["workload"]["prefix_tokens"]
    assert report["restart_disk_share_min"] == 1.0
    assert report["verdicts"]["restart_disk_share_of_prefix_tokens"]["pass"] is True
    assert set(report["ttft_p50_ms"]) == {"miss", "device", "host", "disk"}
    assert "bench tiers: L3 (disk, after restarts) and misses: 12/12 requests (100%), done in" in err


def test_bad_sizes_are_refused_by_the_parser(capsys):
    for argv in (["--repeats", "0"], ["--prefix-tokens", "10"], ["--repeats", "many"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["bench", "tiers", *argv])
