"""Canary selection and halting on local Spark (the DataFrame functions of dlq_replay/canary.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay.canary import CanarySpec, canary_sends, mark_halted, remaining_sends

pytestmark = pytest.mark.integration
T0 = datetime(2024, 5, 1, tzinfo=UTC)
SCHEMA = (
    "replay_id string, signature string, outcome string, outcome_reason string, publish_time timestamp, "
    "dlq_topic string, replay_producer string, sequence_id long"
)


def decisions(spark):
    rows = []
    for sig, n in (("a", 10), ("b", 4)):
        for i in range(n):
            rows.append(
                (f"{sig}{i:02d}", sig, oc.TO_REPUBLISH, None, T0 + timedelta(seconds=n - i), "d", "p", i)
            )
    rows.append(("c00", "c", oc.ARCHIVED, "rule", T0, "d", None, None))
    return spark.createDataFrame(rows, SCHEMA)


def test_canary_is_the_oldest_messages_of_each_group_on_its_own_producers(spark):
    df = decisions(spark)
    canary = {r["replay_id"]: r["replay_producer"] for r in canary_sends(df, CanarySpec(count=3)).collect()}
    # Oldest first: group a's publish times fall with the index, so a09, a08, a07.
    assert set(canary) == {"a09", "a08", "a07", "b03", "b02", "b01"}
    assert set(canary.values()) == {"p-canary"}
    pct = {r["replay_id"] for r in canary_sends(df, CanarySpec(percent=25)).collect()}
    assert pct == {"a09", "a08", "a07", "b03"}  # ceil(10 * 25%) = 3, ceil(4 * 25%) = 1


def test_the_rest_excludes_the_canary_and_halted_groups_which_become_canary_failed(spark):
    df = decisions(spark)
    spec = CanarySpec(count=3)
    rest = {r["replay_id"] for r in remaining_sends(df, spec, halted=["a"]).collect()}
    assert rest == {"b00", "c00"}
    sent = spark.createDataFrame(
        [(r["replay_id"],) for r in canary_sends(df, spec).collect()], "replay_id string"
    )
    marked = {r["replay_id"]: r["outcome"] for r in mark_halted(df, ["a"], sent).collect()}
    assert sum(1 for v in marked.values() if v == oc.CANARY_FAILED) == 7
    assert {k for k, v in marked.items() if v == oc.CANARY_FAILED} == {f"a{i:02d}" for i in range(7)}
    assert marked["a09"] == oc.TO_REPUBLISH  # a sent canary keeps its publish result
    assert marked["c00"] == oc.ARCHIVED
