"""Which run files are local (written with an atomic os.replace) and which go through Hadoop."""

from __future__ import annotations

import pytest

from spark_apps.dlq_replay.storage import local_path


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/data/dlq/runs/r/state.json", "/data/dlq/runs/r/state.json"),
        ("file:///data/dlq/state.json", "/data/dlq/state.json"),
        ("file:/data/dlq/state.json", "/data/dlq/state.json"),
        ("file:///data/my%20dlq/state.json", "/data/my dlq/state.json"),
        ("hdfs://nn:8020/dlq/state.json", None),
        ("s3a://bucket/dlq/state.json", None),
    ],
)
def test_local_path(path, expected):
    assert local_path(path) == expected
