"""task_parquet reads: the decide tasks' shares of a snapshot written by its read tasks, with the marks."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from spark_apps.dlq_replay.task_parquet import Marks, bucket_batches, row_group_units

MARKS = ("_mark", "_mark_reason")


def _snapshot(tmp_path, files: int, rows: int, group_rows: int) -> list[str]:
    """``files`` read-task files of ``rows`` rows each, message ids ``<file>:<row>``."""
    for f in range(files):
        ids = [f"{f}:{i}" for i in range(rows)]
        topics = ["persistent://t/n/dlq"] * rows
        table = pa.table({"topic": topics, "message_id_str": ids, "value": [b"x"] * rows})
        pq.write_table(table, tmp_path / f"part-{f:05d}.parquet", row_group_size=group_rows)
    (tmp_path / "_SUCCESS").write_text("")
    return [f"{f}:{i}" for f in range(files) for i in range(rows)]


def _ids(batches) -> list[str]:
    return [mid for batch in batches for mid in batch.column("message_id_str").to_pylist()]


def test_every_row_is_in_exactly_one_bucket_in_file_order(tmp_path):
    every = _snapshot(tmp_path, files=3, rows=250, group_rows=100)  # 3 row groups per file
    units = row_group_units(str(tmp_path))

    assert len(units) == 9
    columns = ["topic", "message_id_str"]
    shares = [_ids(bucket_batches(units, bucket, 2, columns, None, MARKS, 64)) for bucket in (0, 1)]

    assert sorted(shares[0] + shares[1]) == sorted(every)
    # Row groups of 100, 100 and 50 rows per file; bucket 0 takes units 0, 2, 4, 6, 8, bucket 1 the others.
    assert [len(share) for share in shares] == [400, 350]
    for share in shares:  # each file's rows keep their order within a share
        for f in range(3):
            rows = [int(m.split(":")[1]) for m in share if m.startswith(f"{f}:")]
            assert rows == sorted(rows)


def test_batches_hold_at_most_batch_rows_and_only_the_asked_columns(tmp_path):
    _snapshot(tmp_path, files=1, rows=300, group_rows=300)

    units = row_group_units(str(tmp_path))
    batches = list(bucket_batches(units, 0, 1, ["message_id_str", "topic"], None, MARKS, 64))

    assert max(b.num_rows for b in batches) == 64
    assert batches[0].schema.names == ["message_id_str", "topic", *MARKS]
    assert batches[0].column("_mark").null_count == 64


def test_marks_are_read_from_their_files_and_looked_up_by_topic_and_message_id(tmp_path):
    rows = {"topic": ["a", "b"], "message_id_str": ["2", "1"]}
    marks = {**rows, MARKS[0]: ["duplicate", "already_final"], MARKS[1]: ["another copy ...", None]}
    pq.write_table(pa.table(marks), tmp_path / "part-00000.parquet")
    pq.write_table(
        pa.table({name: pa.array([], pa.string()) for name in marks}), tmp_path / "part-00001.parquet"
    )
    batch = pa.RecordBatch.from_pydict(
        {"topic": ["a", "a", "b", "a\x1f2"], "message_id_str": ["1", "2", "1", ""]}
    )

    mark, reason = Marks.read(str(tmp_path)).columns(batch)

    assert mark.to_pylist() == [None, "duplicate", "already_final", None]
    assert reason.to_pylist() == [None, "another copy ...", None, None]


def test_no_files_give_no_units(tmp_path):
    (tmp_path / "_SUCCESS").write_text("")
    assert row_group_units(str(tmp_path)) == []
