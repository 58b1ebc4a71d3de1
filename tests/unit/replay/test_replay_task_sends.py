"""task_sends.wave_rows: one wave's rows to republish from a decide task's file, in file order, with
row groups outside the wave skipped by their statistics."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay.pulsar_io.republish import REPUBLISH_INPUT_COLUMNS
from spark_apps.dlq_replay.task_parquet import part_file
from spark_apps.dlq_replay.task_sends import SendFilter, _row_groups, wave_rows

PRODUCERS = ("dlq-replay-abc-t0-1", "dlq-replay-abc-t1-1")


def _decisions(rows: int) -> pa.Table:
    """A decide task's rows: every 5th archived (no producer), the others alternate two producers,
    each numbered 0, 1, 2 ... in row order."""
    next_seq = dict.fromkeys(PRODUCERS, 0)
    names = ("replay_id", "target_topic", "replay_producer", "sequence_id")
    columns: dict[str, list] = {name: [] for name in names}
    outcomes = []
    for i in range(rows):
        columns["replay_id"].append(f"r{i}")
        if i % 5 == 4:
            outcomes.append(oc.ARCHIVED)
            columns["target_topic"].append(None)
            columns["replay_producer"].append(None)
            columns["sequence_id"].append(None)
            continue
        producer = PRODUCERS[i % 2]
        outcomes.append(oc.TO_REPUBLISH)
        columns["target_topic"].append(f"persistent://t/n/{producer[-4:-2]}")
        columns["replay_producer"].append(producer)
        columns["sequence_id"].append(next_seq[producer])
        next_seq[producer] += 1
    return pa.table(
        {
            **columns,
            "sequence_id": pa.array(columns["sequence_id"], pa.int64()),
            "out_value": [f"v{i}".encode() for i in range(rows)],
            "key": [None] * rows,
            "ordering_key": [None] * rows,
            "event_time": pa.array([None] * rows, pa.timestamp("us", "UTC")),
            "out_properties": pa.array(
                [[("REPLAY_ID", f"r{i}")] for i in range(rows)], pa.map_(pa.string(), pa.string())
            ),
            "outcome": outcomes,
            "value": [b"original"] * rows,  # not read
        }
    )


def _write(tmp_path, table: pa.Table, row_group_rows: int) -> str:
    path = part_file(str(tmp_path), 1)
    pq.write_table(table, path, row_group_size=row_group_rows)
    return path


def test_the_waves_rows_in_file_order_with_the_republish_columns(tmp_path):
    table = _decisions(1_000)
    path = _write(tmp_path, table, 100)

    batches = list(wave_rows(path, 100, 200, batch_rows=64))
    sent = pa.Table.from_batches(batches)

    assert sent.column_names == list(REPUBLISH_INPUT_COLUMNS)
    numbered = [{**row, "row": i} for i, row in enumerate(table.to_pylist())]
    sending = [row for row in numbered if row["outcome"] == oc.TO_REPUBLISH]
    expected = [row for row in sending if 100 <= row["sequence_id"] < 200]
    assert sent.column("replay_id").to_pylist() == [row["replay_id"] for row in expected]
    assert sent.column("row").to_pylist() == [row["row"] for row in expected]  # its place in the file
    assert sent.num_rows == 200  # 100 sequence ids of each of the two producers
    for producer in PRODUCERS:  # each producer's sequence ids ascend, as the broker's deduplication needs
        pairs = zip(sent["producer_name"].to_pylist(), sent["sequence_id"].to_pylist(), strict=True)
        seqs = [seq for name, seq in pairs if name == producer]
        assert seqs == list(range(100, 200))
    assert sent.column("value").to_pylist()[0] == expected[0]["out_value"]
    assert sent.column("properties").to_pylist()[0] == [("REPLAY_ID", expected[0]["replay_id"])]


def test_small_filtered_slices_are_merged_into_batches_of_about_batch_rows(tmp_path):
    path = _write(tmp_path, _decisions(2_000), 2_000)

    sizes = [batch.num_rows for batch in wave_rows(path, 0, 10_000, batch_rows=500)]

    assert sum(sizes) == 1_600
    assert all(size >= 500 for size in sizes[:-1])


def test_row_groups_outside_the_wave_are_not_read(tmp_path):
    path = _write(tmp_path, _decisions(1_000), 100)  # 40 sequence ids per producer per row group
    meta = pq.ParquetFile(path).metadata

    assert _row_groups(meta, 0, 40) == [0]
    assert _row_groups(meta, 40, 120) == [1, 2]
    assert _row_groups(meta, 400, 500) == []


def test_a_group_with_only_archived_rows_is_skipped_and_an_empty_file_yields_nothing(tmp_path):
    archived = pa.table({"sequence_id": pa.array([None, None], pa.int64()), "outcome": [oc.ARCHIVED] * 2})
    pq.write_table(archived, tmp_path / "archived.parquet")
    assert _row_groups(pq.ParquetFile(tmp_path / "archived.parquet").metadata, 0, 10) == []

    path = _write(tmp_path, _decisions(0), 100)
    assert list(wave_rows(path, 0, 2_000, batch_rows=10)) == []


def test_file_targets_are_the_targets_of_rows_to_republish_only(tmp_path):
    from spark_apps.dlq_replay.task_sends import file_targets

    table = _decisions(40)
    refused = table.slice(0, 5).set_column(  # a refused row keeps its target but is not sent
        table.schema.get_field_index("target_topic"), "target_topic", pa.array(["persistent://t/n/admin"] * 5)
    )
    refused = refused.set_column(
        refused.schema.get_field_index("outcome"), "outcome", pa.array([oc.ORIGIN_REFUSED] * 5)
    )
    pq.write_table(table, part_file(str(tmp_path), 0), row_group_size=7)
    pq.write_table(refused, part_file(str(tmp_path), 1))
    assert file_targets(part_file(str(tmp_path), 0)) == {"persistent://t/n/t0", "persistent://t/n/t1"}
    assert file_targets(part_file(str(tmp_path), 1)) == set()


def _blocked_decisions(per_producer: int) -> pa.Table:
    """Two producers one after the other, as a decide task writes a bucket whose DLQ topics each have
    their own origin: ids 0, 1, 2 ... per producer, and an archived row (no id) after every 4th."""
    table = _decisions(1)
    columns: dict[str, list] = {name: [] for name in table.column_names}
    for p, producer in enumerate(PRODUCERS):
        for seq in range(per_producer):
            rows = [(producer, seq, oc.TO_REPUBLISH)] + ([(None, None, oc.ARCHIVED)] if seq % 4 == 3 else [])
            for name, sequence_id, outcome in rows:
                row = table.slice(0, 1).to_pylist()[0]
                row.update(replay_producer=name, sequence_id=sequence_id, outcome=outcome)
                row["replay_id"] = f"r{p}-{seq}-{outcome}"
                for column, value in row.items():
                    columns[column].append(value)
    return pa.table(columns, schema=table.schema)


def test_decisions_keyed_by_wave_blocks_give_each_wave_its_own_row_groups(tmp_path, monkeypatch):
    from spark_apps.dlq_replay import task_parquet
    from spark_apps.dlq_replay.task_sends import wave_blocks

    monkeypatch.setattr(task_parquet, "KEYED_GROUP_MIN_BYTES", 1)  # test rows are tiny
    table = _blocked_decisions(60)
    schema = table.schema
    out = task_parquet.TaskFile(str(tmp_path), 1, 0, schema, group_key=wave_blocks(20))
    for batch in table.to_batches(max_chunksize=7):  # blocks end inside batches and between them
        out.write(batch)
    out.commit()
    meta = pq.ParquetFile(part_file(str(tmp_path), 1)).metadata
    assert meta.num_rows == table.num_rows
    leaf = [meta.schema.column(i).path for i in range(meta.num_columns)].index("sequence_id")
    blocks = []
    for group in range(meta.num_row_groups):
        stats = meta.row_group(group).column(leaf).statistics
        blocks.append((stats.min // 20, stats.max // 20))
    assert all(low == high for low, high in blocks)  # no row group spans two blocks of 20 ids
    # Each producer's ids 0-59 in blocks 0, 1, 2; the archived rows ride with the ids before them.
    assert blocks == [(0, 0), (1, 1), (2, 2)] * 2
    # A wave reads only its row groups: 2 of 6 for the second wave, and its rows are all there.
    path = part_file(str(tmp_path), 1)
    assert _row_groups(meta, 20, 40) == [1, 4]
    rows = pa.Table.from_batches(list(wave_rows(path, 20, 40, 1000)))
    assert sorted(rows.column("sequence_id").to_pylist()) == sorted([*range(20, 40)] * 2)


def test_a_task_file_writes_the_statistics_of_fixed_width_columns_only(tmp_path):
    from spark_apps.dlq_replay import task_parquet

    table = _blocked_decisions(30)
    out = task_parquet.TaskFile(str(tmp_path), 1, 0, table.schema)
    out.write(table.to_batches()[0])
    out.commit()
    meta = pq.ParquetFile(part_file(str(tmp_path), 1)).metadata
    columns = [meta.row_group(0).column(i) for i in range(meta.num_columns)]
    with_stats = {column.path_in_schema for column in columns if column.is_stats_set}
    assert "sequence_id" in with_stats  # a wave's row groups are chosen by its bounds
    fixed = (pa.types.is_integer, pa.types.is_timestamp, pa.types.is_boolean)
    assert with_stats == {f.name for f in table.schema if any(kind(f.type) for kind in fixed)}
    assert {"outcome", "value"}.isdisjoint(with_stats)


def test_row_groups_keep_a_minimum_size_when_the_key_changes_on_every_row(tmp_path, monkeypatch):
    from spark_apps.dlq_replay import task_parquet
    from spark_apps.dlq_replay.task_sends import wave_blocks

    table = _decisions(400)  # two producers alternating: the block changes between neighbours later on
    row_bytes = table.nbytes / table.num_rows
    monkeypatch.setattr(task_parquet, "KEYED_GROUP_MIN_BYTES", int(row_bytes * 100))
    out = task_parquet.TaskFile(str(tmp_path), 1, 0, table.schema, group_key=wave_blocks(1))
    for batch in table.to_batches(max_chunksize=50):
        out.write(batch)
    out.commit()
    meta = pq.ParquetFile(part_file(str(tmp_path), 1)).metadata
    assert meta.num_rows == 400
    sizes = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
    assert all(size >= 100 for size in sizes[:-1])
    assert len(sizes) <= 4


def test_rows_left_pending_after_a_row_group_ends_do_not_hold_their_whole_batch(tmp_path, monkeypatch):
    from spark_apps.dlq_replay import task_parquet
    from spark_apps.dlq_replay.task_sends import wave_blocks

    monkeypatch.setattr(task_parquet, "KEYED_GROUP_MIN_BYTES", 1)
    table = _blocked_decisions(60).combine_chunks()
    (batch,) = table.to_batches()
    out = task_parquet.TaskFile(str(tmp_path), 1, 0, table.schema, group_key=wave_blocks(50))
    out.write(batch)  # ids 0-49 written as a row group; the rest stays pending
    pool = pa.default_memory_pool()
    held = pool.bytes_allocated()
    del batch, table
    assert pool.bytes_allocated() < held  # the batch's buffers were freed: the pending rows are a copy
    out.commit()
    assert pq.ParquetFile(part_file(str(tmp_path), 1)).metadata.num_rows == 2 * (60 + 15)


def test_a_canary_sends_its_rows_by_canary_producers_and_the_waves_send_the_rest(tmp_path):
    table = _decisions(100).append_column("signature", pa.array([f"g{i % 3}" for i in range(100)]))
    path = _write(tmp_path, table, 20)
    canary = ["r0", "r1", "r2", "r7"]
    ids = tmp_path / "canary_ids"
    ids.mkdir()
    pq.write_table(
        pa.table({"replay_id": canary, "signature": ["g0", "g1", "g2", "g1"]}), str(ids / "part-0.parquet")
    )

    first = SendFilter(str(ids), canary=True)
    sent = pa.Table.from_batches(wave_rows(path, 0, 1_000, 64, first.chooser(), first.columns))
    assert sent.column("replay_id").to_pylist() == canary
    assert set(sent.column("producer_name").to_pylist()) == {f"{p}-canary" for p in PRODUCERS}

    rest = SendFilter(str(ids), canary=False, halted=("g1",))
    sent = pa.Table.from_batches(wave_rows(path, 0, 1_000, 64, rest.chooser(), rest.columns))
    expected = [
        row["replay_id"]
        for i, row in enumerate(table.to_pylist())
        if row["outcome"] == oc.TO_REPUBLISH and row["replay_id"] not in canary and i % 3 != 1
    ]
    assert sent.column("replay_id").to_pylist() == expected
    assert set(sent.column("producer_name").to_pylist()) == set(PRODUCERS)
