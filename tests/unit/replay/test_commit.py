"""commit: the reader-mode commit's per-entry counts from the read and record tasks."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from spark_apps.dlq_replay.commit import EntryFinals, entry_rows, entry_table
from spark_apps.dlq_replay.task_parquet import part_file

T1, T2 = "persistent://t/n/a-DLQ", "persistent://t/n/b-DLQ"


def _snapshot_batch(rows: list[tuple[str, str, int]]) -> pa.RecordBatch:
    topics, ids, sizes = (list(column) for column in zip(*rows, strict=True))
    return pa.RecordBatch.from_pydict(
        {"topic": topics, "message_id_str": ids, "batch_size": pa.array(sizes, pa.int32())}
    )


def _ledger_batch(rows: list[tuple[str, str, bool | None]]) -> pa.RecordBatch:
    topics, ids, final = (list(column) for column in zip(*rows, strict=True))
    return pa.RecordBatch.from_pydict(
        {"dlq_topic": topics, "dlq_message_id": ids, "final": pa.array(final, pa.bool_())}
    )


def test_entries_and_finals_merge_into_the_commit_table(tmp_path):
    """An entry's messages may be in two read batches and its final rows in two record buckets: counts
    are summed per entry, batch sizes kept, and an entry with no final row counts 0."""
    entries_dir, finals_dir = tmp_path / "snapshot_entries", tmp_path / "commit_parts"
    entries_dir.mkdir()
    batches = [
        _snapshot_batch([(T1, "5:1:-1:0", 3), (T1, "5:1:-1:1", 3), (T1, "5:2:-1:-1", 1), (T2, "7:0:", 1)]),
        _snapshot_batch([(T1, "5:1:-1:2", 3), (T2, "7:1:-1:0", 2)]),
    ]
    for i, batch in enumerate(batches):
        pq.write_table(pa.Table.from_batches([entry_rows(batch)]), part_file(str(entries_dir), i))
    finals_dir.mkdir()
    buckets = [
        [(T1, "5:1:-1:0", True), (T1, "5:2:-1:-1", True), (T2, "7:1:-1:0", True)],
        [(T1, "5:1:-1:1", True), (T1, "5:1:-1:2", False), (T2, "7:0:", None)],
    ]
    for bucket, rows in enumerate(buckets):
        finals = EntryFinals()
        finals.add(_ledger_batch(rows[:2]))
        finals.add(_ledger_batch(rows[2:]))
        finals.write(str(finals_dir), bucket)

    table = entry_table(str(entries_dir), str(finals_dir))
    got = sorted(table.to_pylist(), key=lambda r: (r["dlq_topic"], r["ledger_id"], r["entry_id"]))
    assert got == [
        {"dlq_topic": T1, "ledger_id": 5, "entry_id": 1, "messages": 3, "final_messages": 2, "batch_size": 3},
        {"dlq_topic": T1, "ledger_id": 5, "entry_id": 2, "messages": 1, "final_messages": 1, "batch_size": 1},
        {"dlq_topic": T2, "ledger_id": 7, "entry_id": 0, "messages": 1, "final_messages": 0, "batch_size": 1},
        {"dlq_topic": T2, "ledger_id": 7, "entry_id": 1, "messages": 1, "final_messages": 1, "batch_size": 2},
    ]


def test_no_entries_give_an_empty_table_and_a_bucket_without_rows_writes_an_empty_part(tmp_path):
    entries_dir, finals_dir = tmp_path / "e", tmp_path / "f"
    entries_dir.mkdir()
    finals_dir.mkdir()
    EntryFinals().write(str(finals_dir), 0)
    assert entry_table(str(entries_dir), str(finals_dir)).num_rows == 0
    empty = entry_rows(_snapshot_batch([(T1, "1:1:-1:-1", 1)]).slice(0, 0))
    assert empty.num_rows == 0
    assert empty.schema.names == ["dlq_topic", "ledger_id", "entry_id", "messages", "batch_size"]


def _entries(rows: list[tuple[str, int, int, int, int, int | None]]) -> pa.Table:
    names = ("dlq_topic", "ledger_id", "entry_id", "messages", "final_messages", "batch_size")
    columns = list(zip(*rows, strict=True))
    return pa.table(
        {
            n: pa.array(c, pa.string() if n == "dlq_topic" else pa.int64())
            for n, c in zip(names, columns, strict=True)
        }
    )


def test_consumer_commit_splits_whole_and_partial_entries():
    from spark_apps.dlq_replay.commit import ConsumerCommit
    from spark_apps.dlq_replay.pulsar_io.window import PartitionWindow

    table = _entries(
        [
            (T1, 5, 0, 3, 3, 3),  # whole
            (T1, 5, 1, 2, 1, 2),  # one pending: partial
            (T1, 5, 2, 2, 2, 3),  # the snapshot read 2 of a batch of 3: partial, never acked whole
            (T1, 5, 3, 1, 0, 1),  # pending
            (T1, 5, 4, 4, 4, 4),  # reaches past the window end (5:4 batch index 1): partial
            (T2, 7, 0, 2, 0, 2),  # T2 has no final message: not read again
        ]
    )
    windows = [PartitionWindow(T1, -1, "5:4:-1:1"), PartitionWindow(T2, -1, "7:0:-1:-1")]
    split = ConsumerCommit(table, windows)
    assert split.whole.to_pylist() == [
        {"dlq_topic": T1, "dlq_message_id": None, "ledger_id": 5, "entry_id": 0, "batch_size": 3}
    ]
    assert split.partial.to_pylist() == [{"dlq_topic": T1, "ledger_id": 5, "entry_id": e} for e in (1, 2, 4)]
    assert (split.expected, split.in_whole, split.unread) == (10, 3, 2)


def test_consumer_commit_refuses_a_partition_outside_the_window():
    import pytest

    from spark_apps.dlq_replay.commit import ConsumerCommit
    from spark_apps.dlq_replay.pulsar_io.errors import WindowError
    from spark_apps.dlq_replay.pulsar_io.window import PartitionWindow

    with pytest.raises(WindowError, match=r"not in the run's window.*start a new run"):
        ConsumerCommit(_entries([(T2, 7, 0, 1, 1, 1)]), [PartitionWindow(T1, -1, "5:4:-1:-1")])
