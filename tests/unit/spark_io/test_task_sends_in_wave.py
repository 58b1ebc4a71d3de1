"""task_sends: a batch whose rows are all to send in the wave is passed on as it is, without a copy;
any other batch keeps exactly the rows to republish whose sequence id is in the wave."""

from __future__ import annotations

import pyarrow as pa

from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay.task_sends import SEND_COLUMNS, _in_wave, _renamed


def batch(outcomes: list[str], seqs: list[int | None]) -> pa.RecordBatch:
    n = len(seqs)
    columns = {name: pa.nulls(n, pa.string()) for name in SEND_COLUMNS}
    columns["replay_id"] = pa.array([f"r{i}" for i in range(n)])
    columns["sequence_id"] = pa.array(seqs, pa.int64())
    columns["outcome"] = pa.array(outcomes)
    return pa.RecordBatch.from_pydict(columns)


def test_a_batch_wholly_in_the_wave_is_not_copied():
    rows = batch([oc.TO_REPUBLISH] * 3, [10, 11, 12])
    assert _in_wave(rows, 10, 13) is rows


def test_rows_of_other_waves_archived_rows_and_rows_without_a_sequence_id_are_left_out():
    rows = batch(
        [oc.TO_REPUBLISH, oc.ARCHIVED, oc.TO_REPUBLISH, oc.TO_REPUBLISH, oc.TO_REPUBLISH],
        [10, None, None, 13, 9],
    )
    assert _in_wave(rows, 10, 13).column("replay_id").to_pylist() == ["r0"]
    assert _in_wave(rows, 0, 100).column("replay_id").to_pylist() == ["r0", "r3", "r4"]
    assert _in_wave(batch([oc.ARCHIVED], [None]), 0, 100).num_rows == 0


def test_renamed_merges_only_several_batches():
    one = batch([oc.TO_REPUBLISH] * 2, [1, 2])
    merged = _renamed([one, batch([oc.TO_REPUBLISH], [3])])
    assert merged.schema.names == list(SEND_COLUMNS.values())
    assert merged.column("sequence_id").to_pylist() == [1, 2, 3]
    alone = _renamed([one])
    assert alone.column("sequence_id").to_pylist() == [1, 2]
    assert alone.column("sequence_id").buffers()[1].address == one.column("sequence_id").buffers()[1].address
