"""Canary selection on local Spark (the DataFrame function of dlq_replay/canary.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from pulsar_dlq_consumer.replay_options import CanarySpec
from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay.canary import canary_selection

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


def test_canary_is_the_oldest_messages_of_each_group(spark):
    df = decisions(spark)
    canary = {r["replay_id"]: r["signature"] for r in canary_selection(df, CanarySpec(count=3)).collect()}
    # Oldest first: group a's publish times fall with the index, so a09, a08, a07.
    assert canary == {"a09": "a", "a08": "a", "a07": "a", "b03": "b", "b02": "b", "b01": "b"}
    pct = {r["replay_id"] for r in canary_selection(df, CanarySpec(percent=25)).collect()}
    assert pct == {"a09", "a08", "a07", "b03"}  # ceil(10 * 25%) = 3, ceil(4 * 25%) = 1
