"""Lineage properties of replayed messages."""

from __future__ import annotations

import pyarrow as pa
import pytest

from spark_apps.dlq_replay.lineage import lineage_maps, previous_replay_count


@pytest.mark.parametrize(
    ("props", "count"),
    [
        (None, 0),
        ({}, 0),
        ({"REPLAY_COUNT": "2"}, 2),
        ({"REPLAY_COUNT": " 7 "}, 7),
        ({"REPLAY_COUNT": "x"}, None),
        ({"REPLAY_COUNT": "-1"}, None),
        ({"REPLAY_COUNT": "99999999999"}, None),
    ],
)
def test_previous_replay_count(props, count):
    assert previous_replay_count(props) == count


def test_bookkeeping_stripped_lineage_set_and_forged_lineage_overridden():
    props = {
        "tenant": "acme",
        "REAL_TOPIC": "persistent://public/default/orders",
        "ORIGIN_MESSAGE_ID": "1:2:-1:-1",
        "RECONSUMETIMES": "3",
        "__dlq.errors.exception.class": "ValueError",
        "__connect.errors.topic": "x",
        "kafka_dlt-exception-message": "boom",
        "REPLAY_ID": "forged",
        "REPLAY_COUNT": "1",
    }
    out = lineage_maps(
        pa.array([list(props.items())], pa.map_(pa.string(), pa.string())),
        pa.array([True]),
        pa.array(["rid"]),
        "run-1",
        pa.array([1]),
        pa.array(["persistent://p/d/dlq"]),
        pa.array(["m:f@2"]),
    )
    assert dict(out[0].as_py()) == {
        "tenant": "acme",
        "REPLAY_ID": "rid",
        "REPLAY_RUN_ID": "run-1",
        "REPLAY_COUNT": "2",
        "REPLAYED_FROM": "persistent://p/d/dlq",
        "REPLAY_FIX": "m:f@2",
    }
