"""The C1-only JIT for a local replay's driver JVM: when ``"auto"`` chooses it, and how it joins the
driver's JVM options."""

from __future__ import annotations

import pytest

from airflow_provider_dlq.driver_footprint import QUICK_JIT_OPTION, quick_jit_chosen, with_quick_jit

OPTIONS = "spark.driver.extraJavaOptions"


@pytest.mark.parametrize(
    ("master", "chosen"),
    [
        ("local", True),
        ("local[2]", True),
        ("local[*]", True),
        ("local[2,3]", True),
        ("spark://127.0.0.1:7077", False),  # the executors do the work, not the driver
        ("yarn", False),
        ("k8s://https://127.0.0.1:6443", False),
    ],
)
def test_auto_chooses_it_for_every_local_master_whatever_the_backlog(master, chosen):
    assert quick_jit_chosen("auto", master) is chosen


def test_true_and_false_override_the_master():
    assert quick_jit_chosen(True, "yarn") is True
    assert quick_jit_chosen(False, "local[2]") is False


def test_the_option_follows_the_users_jvm_options_unless_they_choose_the_jit():
    assert with_quick_jit({})[OPTIONS] == QUICK_JIT_OPTION
    mine = {OPTIONS: "-Dx=1", "spark.sql.shuffle.partitions": "4"}
    assert with_quick_jit(mine) == {OPTIONS: f"-Dx=1 {QUICK_JIT_OPTION}", "spark.sql.shuffle.partitions": "4"}
    assert mine[OPTIONS] == "-Dx=1"  # the caller's mapping is not changed
    for chosen in ("-XX:TieredStopAtLevel=4", "-XX:-TieredCompilation"):
        assert with_quick_jit({OPTIONS: chosen}) == {OPTIONS: chosen}
