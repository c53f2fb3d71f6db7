"""`prefixscope bench tiers`: the command is wired, and its verdicts read the figures the way its targets say."""

from __future__ import annotations

from local_engine.bench_tiers import shared_prefix_tokens, verdicts
from prefixscope.cli import build_parser


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
