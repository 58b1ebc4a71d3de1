"""The benchmark's comparisons and targets (pure: results made up, nothing runs)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.results_model import RunResult, comparisons, result_from_json
from bench.table import RED, ceiling_warnings, comparison_table, results_table

M = 1_000_000


def _result(contender: str, n: int, wall: float, broker: str = "apache", **extra: Any) -> RunResult:
    return RunResult(contender, n, n, wall, wall * 0.9, ok=True, broker=broker, **extra)


def _targets(results: list[RunResult]) -> dict[tuple[str, str, int], tuple[Any, Any, str]]:
    return {
        (t["broker"], t["target"], t["n"]): (t["value"], t["met"], t["note"])
        for t in comparisons(results)["targets"]
    }


TUNED = "local[2] / tuned single process, end to end"
CONNECT = "Spark Connect / local[2], end to end"
US = "local[2] µs per message without start-up, 3M / 1M"
DRIVER = "local[2] Python driver peak RSS, 3M / 1M"
TREE = "local[2] peak tree RSS MiB"


def test_a_contender_faster_than_the_ceiling_is_flagged_in_red():
    results = [
        _result("ceiling", 100_000, 10.0),
        _result("tuned", 100_000, 8.0),
        _result("ours", 100_000, 30.0),
    ]
    comp = comparisons(results)
    assert comp["ceiling_beaten"] == [{"broker": "apache", "n": 100_000, "contender": "tuned", "ratio": 1.25}]
    (line,) = ceiling_warnings(comp, color=True)
    assert line.startswith(RED)
    assert "tuned single process ran 1.25x the copy ceiling" in line
    (plain,) = ceiling_warnings(comp, color=False)
    assert plain.startswith("**CEILING BEATEN")


def test_every_target_on_apache_pulsar_holds_or_fails_by_its_figures():
    results = [
        _result("tuned", M, 70.0),
        _result("ours", M, 60.0, memory_mib={"py_driver_mib": 200.0, "tree_mib": 1300.0}),
        _result("ours_connect", M, 80.0),
        _result("tuned", 100_000, 7.0),
        _result("ours", 100_000, 16.0),
        # 3M: wall 3.3x the 1M run (work 0.9x of it): +10% µs per message; the driver +20%.
        _result("ours", 3 * M, 198.0, memory_mib={"py_driver_mib": 240.0, "tree_mib": 1600.0}),
    ]
    got = _targets(results)
    assert got == {
        ("apache", TUNED, M): (1.167, True, ""),
        ("apache", TUNED, 100_000): (0.438, False, ""),
        ("apache", CONNECT, M): (0.75, False, ""),
        ("apache", US, 3 * M): (1.1, True, ""),
        ("apache", DRIVER, 3 * M): (1.2, False, ""),
        ("apache", TREE, 3 * M): (1600.0, False, ""),
    }
    table = comparison_table(comparisons(results))
    assert "Targets (Apache Pulsar only):" in table
    assert f"| Apache Pulsar | {CONNECT} | 1M | 0.75 | >= 0.8 | FAILS |" in table
    assert f"| Apache Pulsar | {US} | 3M | 1.10 | <= 1.15 | holds |" in table


def test_targets_are_listed_as_not_run_when_a_size_or_contender_is_missing():
    got = _targets([_result("ours", M, 60.0), _result("tuned", M, 70.0)])
    assert got[("apache", TUNED, M)][:2] == (1.167, True)
    for key in (("apache", CONNECT, M), ("apache", US, 3 * M), ("apache", TREE, 3 * M)):
        assert got[key] == (None, None, "not run")
    assert "| 3M | n/a | <= 1536 | n/a (not run) |" in comparison_table(
        comparisons([_result("ours", M, 60.0)])
    )


def test_pulsar_lite_runs_get_no_targets():
    results = [_result("ours", M, 60.0, broker="lite"), _result("tuned", M, 70.0, broker="lite")]
    comp = comparisons(results)
    assert comp["targets"] == []
    assert comp["ratios"]["lite/1000000"]["ours/tuned"] == 1.167  # still measured and compared


def test_a_target_is_not_met_by_a_run_that_failed_verification_or_ran_elsewhere():
    wrong = _result("ours", M, 60.0)
    wrong.ok = False
    got = _targets([wrong, _result("tuned", M, 70.0)])
    assert got[("apache", TUNED, M)] == (1.167, False, "a run failed verification")
    elsewhere = _result("ours", M, 60.0, details={"master": "local[4]"})
    got = _targets([elsewhere, _result("tuned", M, 70.0)])
    assert got[("apache", TUNED, M)] == (1.167, False, "ours ran on local[4], not local[2]")


def test_growth_uses_time_without_start_up_and_the_python_drivers_own_peak():
    """A fixed start-up would hide a per-message cost that grows: the target reads ``work_s``; and the
    Python driver's peak, not the tree's (whose JVM and workers hold per-partition buffers)."""
    one = RunResult("ours", M, M, 70.0, 60.0, ok=True, broker="apache", memory_mib={"py_driver_mib": 250.0})
    three = RunResult(
        "ours", 3 * M, 3 * M, 200.0, 198.0, ok=True, broker="apache", memory_mib={"py_driver_mib": 346.0}
    )
    got = _targets([one, three])
    assert got[("apache", US, 3 * M)] == (1.1, True, "")  # wall alone: 0.952
    assert got[("apache", DRIVER, 3 * M)] == (1.384, False, "")


def test_connect_is_compared_with_local2_in_the_ratios():
    results = [_result("ours", 400, 20.0), _result("ours_connect", 400, 25.0)]
    ratios = comparisons(results)["ratios"]["apache/400"]
    assert ratios["ours_connect/ours"] == 0.8
    assert ratios["ours_connect/ours (no start-up)"] == 0.8


def test_results_table_shows_each_memory_role_and_us_per_message():
    r = _result(
        "ours_connect",
        M,
        100.0,
        memory_mib={
            "py_driver_mib": 210.0,
            "jvm_mib": 150.0,
            "py_workers_mib": 600.0,
            "remote_jvm_mib": 700.0,
            "tree_mib": 1650.0,
        },
    )
    table = results_table([r])
    assert "Python driver / spark-submit JVM / Python workers / cluster/Connect JVMs / tree" in table
    assert "| this project (Spark Connect, server on local[2]) |" in table
    assert "| 90.0 | 210 / 150 / 600 / 700 / 1,650 | yes |" in table
    old = result_from_json({**r.to_json(), "memory_mib": {"driver_mib": 400.0, "tree_mib": 900.0}})
    assert "| n/a / n/a / n/a / n/a / 900 |" in results_table([old])  # an earlier results.json renders


@pytest.mark.parametrize(
    ("text", "n"), [("0", 0), ("2k", 2_000), ("100k", 100_000), ("1m", M), ("3m", 3 * M), ("3M", 3 * M)]
)
def test_sizes_accept_3m(text: str, n: int) -> None:
    from bench.run import parse_sizes

    assert parse_sizes(f"{text},10k") == [n, 10_000]


def test_connect_and_scaling_variants_run_up_to_their_limits():
    from bench.run import build_parser, runs_at

    args = build_parser().parse_args([])
    assert (args.output_root, args.connect_max, args.scaling_max) == ("local", M, 100_000)
    assert runs_at("ours_connect", M, args)
    assert not runs_at("ours_connect", 3 * M, args)
    assert runs_at("ours_cluster", 100_000, args)
    assert not runs_at("ours_cluster", M, args)
    assert runs_at("ours", 3 * M, args)
    every = build_parser().parse_args(["--connect-max", "0", "--output-root", "s3"])
    assert runs_at("ours_connect", 3 * M, every)
    assert every.output_root == "s3"
