"""The decide step's scope columns: the first filter a message fails, the marks, ``--max-messages``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pyarrow as pa

from spark_apps.dlq_replay.scope import MARK, MARK_REASON, Filters, add_scope_columns, filter_reasons

T0 = datetime(2024, 5, 1, tzinfo=UTC)
COLUMNS = {
    "signature": pa.array(["a", "b", None, "a", "a", "a"]),
    "error_class": pa.array(["x.Timeout", "Timeout", "Timeout", "NotTimeout", None, "Timeout"]),
}
TIMES = pa.array([T0, T0, T0, T0, T0, None], pa.timestamp("us", tz="UTC"))


def test_each_message_gets_the_first_filter_it_fails():
    filters = Filters(signatures=("a", "b"), error_class="Timeout", since=T0 - timedelta(hours=1))
    assert filter_reasons(filters, COLUMNS, TIMES).to_pylist() == [
        None,
        None,
        "not among the groups chosen for this run (--signatures)",
        "not selected by --error-class",
        "not selected by --error-class",
        "published before --since",
    ]
    late = Filters(until=datetime(2024, 5, 1, 2, tzinfo=timezone(timedelta(hours=2))))  # = T0
    assert filter_reasons(late, COLUMNS, TIMES).to_pylist()[:2] == ["published at or after --until"] * 2
    assert filter_reasons(Filters(), COLUMNS, TIMES).null_count == 6


def test_marks_win_then_the_filters_then_max_messages():
    marks = pa.array(["duplicate", "chosen", None, None, "chosen", None])
    reasons = pa.array(["a copy", None, None, None, None, None])
    batch = pa.RecordBatch.from_arrays([marks, reasons, TIMES], [MARK, MARK_REASON, "publish_time"])
    columns = dict(COLUMNS)
    add_scope_columns(batch, columns, Filters(error_class="Timeout", max_messages=2))
    assert columns["scope"].to_pylist() == ["duplicate", "in", "filtered", "filtered", "filtered", "filtered"]
    assert columns["scope_reason"].to_pylist() == [
        "a copy",
        None,
        "beyond --max-messages",
        "not selected by --error-class",
        "not selected by --error-class",
        "beyond --max-messages",
    ]
    columns = dict(COLUMNS)
    add_scope_columns(batch, columns, Filters())
    assert columns["scope"].to_pylist() == ["duplicate", "in", "in", "in", "in", "in"]
