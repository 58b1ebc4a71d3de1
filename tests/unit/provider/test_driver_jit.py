"""The C1-only JIT for a small replay's driver JVM: when ``"auto"`` chooses it, and how it joins the
driver's JVM options."""

from __future__ import annotations

import pytest

from airflow_provider_dlq.driver_footprint import (
    QUICK_JIT_MAX_MESSAGES,
    QUICK_JIT_OPTION,
    quick_jit_chosen,
    with_quick_jit,
)

OPTIONS = "spark.driver.extraJavaOptions"


@pytest.mark.parametrize(
    ("master", "messages", "exact", "chosen"),
    [
        ("local[2]", 10_000, True, True),
        ("local[*]", QUICK_JIT_MAX_MESSAGES, True, True),
        ("local[2]", QUICK_JIT_MAX_MESSAGES + 1, True, False),  # a large run keeps C2's faster code
        ("local[2]", 10_000, False, False),  # entries only: a lower bound, the run may be large
        ("local[2]", None, False, False),  # backlog unknown
        ("spark://127.0.0.1:7077", 10_000, True, False),  # the executors do the work, not the driver
        ("yarn", 0, True, False),
    ],
)
def test_auto_chooses_it_for_small_local_runs_of_a_known_size(master, messages, exact, chosen):
    assert quick_jit_chosen("auto", master, messages, exact) is chosen


def test_true_and_false_override_the_size():
    assert quick_jit_chosen(True, "yarn", None, False) is True
    assert quick_jit_chosen(False, "local[2]", 10, True) is False


def test_the_option_follows_the_users_jvm_options_unless_they_choose_the_jit():
    assert with_quick_jit({})[OPTIONS] == QUICK_JIT_OPTION
    mine = {OPTIONS: "-Dx=1", "spark.sql.shuffle.partitions": "4"}
    assert with_quick_jit(mine) == {OPTIONS: f"-Dx=1 {QUICK_JIT_OPTION}", "spark.sql.shuffle.partitions": "4"}
    assert mine[OPTIONS] == "-Dx=1"  # the caller's mapping is not changed
    for chosen in ("-XX:TieredStopAtLevel=4", "-XX:-TieredCompilation"):
        assert with_quick_jit({OPTIONS: chosen}) == {OPTIONS: chosen}
