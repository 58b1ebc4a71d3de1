"""Option validation of the data source, republish input helpers and commit input checks (pure logic)."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from spark_apps.dlq_replay.pulsar_io.commit import make_commit_fn
from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf
from spark_apps.dlq_replay.pulsar_io.errors import PulsarConfigError, RepublishError, WindowError
from spark_apps.dlq_replay.pulsar_io.republish import _epoch_ms, _properties, republish_batches
from spark_apps.dlq_replay.pulsar_io.source import PulsarDataSourceReader, PulsarInputPartition
from spark_apps.dlq_replay.pulsar_io.window import PartitionWindow, windows_to_json

BASE = {"service.url": "pulsar://127.0.0.1:6650", "subscription": "dlq-replayer", "topics": "a-DLQ"}


def reader(**overrides: str) -> PulsarDataSourceReader:
    options = {**BASE, **overrides}
    return PulsarDataSourceReader({k: v for k, v in options.items() if v is not None}, None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"subscription": ""}, "'subscription' is required"),
        ({"topics": ""}, "'topics' is required unless 'window'"),
        ({"parallelism": "0"}, "'parallelism' must be >= 1"),
        ({"parallelism": "two"}, "'parallelism' must be an integer"),
        ({"idle.timeout.ms": "-5"}, "'idle.timeout.ms' must be >= 1"),
        ({"window": "[1, 2]"}, "windows_to_json"),
        ({"service.url": "localhost:6650"}, "pulsar://"),
    ],
)
def test_reader_options_fail_early_with_the_fix(overrides, message):
    with pytest.raises((PulsarConfigError, WindowError), match=message):
        reader(**overrides)


def test_reader_plans_parallelism_slots_per_partition_and_skips_empty_windows():
    windows = [
        PartitionWindow("persistent://public/default/a-DLQ", -1, "3:9:-1:-1"),
        PartitionWindow("persistent://public/default/b-DLQ-partition-0", 0, "4:1:0:-1"),
        PartitionWindow("persistent://public/default/b-DLQ-partition-1", 1, None),
    ]
    r = reader(topics="", window=windows_to_json(windows), parallelism="2")
    parts = r.partitions()
    assert [(p.window.topic, p.slot) for p in parts] == [
        ("persistent://public/default/a-DLQ", 0),
        ("persistent://public/default/a-DLQ", 1),
        ("persistent://public/default/b-DLQ-partition-0", 0),
        ("persistent://public/default/b-DLQ-partition-0", 1),
    ]
    import pickle

    clone = pickle.loads(pickle.dumps(parts[2]))
    assert isinstance(clone, PulsarInputPartition)
    assert clone.window == windows[1]
    # A topic filter keeps its partitions; a topic missing from the window is an error.
    only_b = reader(topics="b-DLQ", window=windows_to_json(windows)).partitions()
    assert [p.window.topic for p in only_b] == ["persistent://public/default/b-DLQ-partition-0"]
    with pytest.raises(WindowError, match="no entry in the 'window' option"):
        reader(topics="c-DLQ", window=windows_to_json(windows)).partitions()
    # Nothing to read still plans one (empty) partition, as Spark needs one.
    empty = reader(topics="", window=windows_to_json(windows[2:])).partitions()
    assert len(empty) == 1
    assert empty[0].window.end_message_id is None


def test_epoch_ms_handles_units_and_nulls():
    ts = dt.datetime(2024, 5, 1, 12, 0, 0, 123000, tzinfo=dt.UTC)
    ms = int(ts.timestamp() * 1000)
    for unit in ("s", "ms", "us", "ns"):
        col = pa.array([ts, None], pa.timestamp(unit, tz="UTC"))
        expected = ms - ms % 1000 if unit == "s" else ms
        assert _epoch_ms(col) == [expected, None]
    assert _epoch_ms(pa.nulls(2)) == [None, None]
    with pytest.raises(RepublishError, match="event_time must be a timestamp"):
        _epoch_ms(pa.array([1, 2]))


def test_properties_from_map_column():
    col = pa.array([[("a", "1"), ("b", "2")], [], None], pa.map_(pa.string(), pa.string()))
    assert _properties(col) == [{"a": "1", "b": "2"}, {}, None]


def test_rate_limiter_rejects_non_positive_rates():
    with pytest.raises(RepublishError, match="rate_limit_per_s must be > 0"):
        next(republish_batches(iter([]), conf=PulsarConf("pulsar://127.0.0.1:1"), rate_limit_per_s=0))


def test_commit_fn_rejects_foreign_topics_and_bad_input():
    conf = PulsarConf("pulsar://127.0.0.1:1", token_env=None)
    fn = make_commit_fn(conf, [PartitionWindow("persistent://t/n/a", -1, "1:1:-1:-1")], "sub", 100)
    with pytest.raises(WindowError, match="not in the run's frozen window"):
        fn(pa.table({"dlq_topic": ["persistent://t/n/zzz"], "dlq_message_id": ["1:1:-1:-1"]}))
    with pytest.raises(PulsarConfigError, match="lacks columns"):
        fn(pa.table({"dlq_topic": ["persistent://t/n/a"]}))
    with pytest.raises(PulsarConfigError, match="null dlq_message_id"):
        fn(pa.table({"dlq_topic": ["persistent://t/n/a"], "dlq_message_id": pa.array([None], pa.string())}))
    with pytest.raises(PulsarConfigError, match="null dlq_topic"):
        fn(pa.table({"dlq_topic": pa.array([None], pa.string()), "dlq_message_id": ["1:1:-1:-1"]}))
    # Whole entries: a row names a message or an entry, never neither; the entry columns come together.
    with pytest.raises(PulsarConfigError, match=r"lacks columns.*'batch_size'"):
        fn(pa.table({"dlq_topic": ["persistent://t/n/a"], "dlq_message_id": ["1:1:-1:-1"], "ledger_id": [1]}))
    with pytest.raises(PulsarConfigError, match="neither a dlq_message_id nor a whole entry"):
        fn(
            pa.table(
                {
                    "dlq_topic": ["persistent://t/n/a"],
                    "dlq_message_id": pa.array([None], pa.string()),
                    "ledger_id": pa.array([1], pa.int64()),
                    "entry_id": pa.array([None], pa.int64()),
                    "batch_size": pa.array([1], pa.int64()),
                }
            )
        )
    # Ids beyond the window end are ignored without touching the broker.
    out = fn(pa.table({"dlq_topic": ["persistent://t/n/a"], "dlq_message_id": ["5:0:-1:-1"]}))
    assert out.to_pylist() == [
        {
            "dlq_topic": "persistent://t/n/a",
            "acked": 0,
            "left_pending": 0,
            "beyond_window": 0,
            "final_in_partial_entries": 0,
            "unacked_final": 0,
            "entries_acked": 0,
            "messages_read": 0,
        }
    ]
    with pytest.raises(PulsarConfigError, match="subscription is required"):
        make_commit_fn(conf, [], "", 100)


def test_properties_of_a_sliced_map_column_and_of_a_null_column():
    col = pa.array([[("a", "1")], [("b", "2"), ("c", "3")], [("d", "4")]], pa.map_(pa.string(), pa.string()))
    assert _properties(col.slice(1, 2)) == [{"b": "2", "c": "3"}, {"d": "4"}]
    assert _properties(pa.nulls(2)) == [None, None]
    with pytest.raises(RepublishError, match="map<string,string>"):
        _properties(pa.array(["x"]))


class _UndecodableMessage:
    """A DLQ message whose key and properties are not valid UTF-8 (the client raises on access)."""

    def partition_key(self):
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

    def properties(self):
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

    def ordering_key(self):
        return b"\xffok"

    def data(self):
        return b"payload"

    def publish_timestamp(self):
        return 1_700_000_000_000

    def event_timestamp(self):
        return 0

    def redelivery_count(self):
        return 3

    def producer_name(self):
        return "legacy"


class _Id:
    def serialize(self):
        return b"\x08\x01"


def test_undecodable_text_keeps_the_message_flagged():
    from pyspark.sql.pandas.types import to_arrow_schema

    from spark_apps.dlq_replay.pulsar_io.source import (
        SOURCE_SCHEMA,
        UNDECODABLE_PROPERTY,
        _BatchBuilder,
        ddl_struct,
    )

    schema = to_arrow_schema(ddl_struct(SOURCE_SCHEMA), timezone="UTC")
    builder = _BatchBuilder(PartitionWindow("persistent://t/n/dlq", -1, "1:1:-1:-1"), schema)
    assert builder.add_entry([("1:1:-1:-1", _UndecodableMessage(), _Id())], 1) == 1
    row = builder.flush().to_pylist()[0]
    assert row["value"] == b"payload"
    assert row["key"] is None
    assert row["ordering_key"] == "\ufffdok"
    assert dict(row["properties"]) == {UNDECODABLE_PROPERTY: "properties or key are not valid UTF-8"}
    assert row["event_time"] is None
    assert row["redelivery_count"] == 3


def test_reader_mode_windows_plan_disjoint_shares_of_the_pending_entries():
    from spark_apps.dlq_replay.pulsar_io.cursor import EntryRange

    pending = (EntryRange(3, 0, 5999, 0), EntryRange(3, 6100, 9999, 100))
    windows = [
        PartitionWindow("persistent://public/default/a-DLQ-partition-0", 0, "3:9999:0:-1", pending),
        PartitionWindow("persistent://public/default/a-DLQ-partition-1", 1, "4:0:1:-1", ()),
    ]
    r = reader(topics="", window=windows_to_json(windows), parallelism="3", **{"reader.min.entries": "1000"})
    parts = r.partitions()
    # The fully acked partition-1 gets no task; partition-0's 9,900 pending entries get 3 shares.
    assert [(p.window.topic, p.slot) for p in parts] == [(windows[0].topic, s) for s in range(3)]
    assert [sum(x.entries for x in p.share) for p in parts] == [3300, 3300, 3300]
    assert parts[0].share[0].start == (3, 0)
    assert parts[-1].share[-1].stop == (3, 9999)


def test_admin_url_option_and_conf_validation():
    conf = PulsarConf.from_options({**BASE, "admin.url": "http://127.0.0.1:8080/"})
    assert conf.admin_url == "http://127.0.0.1:8080"
    assert conf.to_options()["admin.url"] == "http://127.0.0.1:8080"
    assert PulsarConf.from_options(BASE).admin_url is None
    with pytest.raises(PulsarConfigError, match="admin_url must start with http"):
        PulsarConf("pulsar://127.0.0.1:6650", admin_url="127.0.0.1:8080")


def test_entry_commit_fn_checks_its_input_before_touching_the_broker():
    from spark_apps.dlq_replay.pulsar_io.commit import EntryCommitFn
    from spark_apps.dlq_replay.pulsar_io.cursor import EntryRange

    conf = PulsarConf("pulsar://127.0.0.1:1", token_env=None, admin_url="http://127.0.0.1:1")
    window = PartitionWindow("persistent://t/n/a", -1, "1:9:-1:-1", (EntryRange(1, 0, 9, 0),))
    fn = EntryCommitFn(conf, [window], "sub").commit_table
    row = {"ledger_id": [1], "entry_id": [3], "messages": [1], "final_messages": [1], "batch_size": [1]}
    with pytest.raises(WindowError, match="no reader-mode window"):
        fn(pa.table({"dlq_topic": ["persistent://t/n/zzz"], **row}))
    with pytest.raises(WindowError, match="beyond the window end"):
        fn(pa.table({"dlq_topic": ["persistent://t/n/a"], **row, "entry_id": [10]}))
    with pytest.raises(PulsarConfigError, match="lacks columns"):
        fn(pa.table({"dlq_topic": ["persistent://t/n/a"]}))
    with pytest.raises(PulsarConfigError, match="verifies acks through admin REST"):
        EntryCommitFn(PulsarConf("pulsar://127.0.0.1:1"), [window], "sub")
