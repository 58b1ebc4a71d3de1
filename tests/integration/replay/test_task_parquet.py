"""task_parquet: the Python tasks write the dataset themselves; Spark reads back exactly the rows the
tasks made, with the tallies of every batch, the run's dictionary policy, and an atomic commit."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_apps.dlq_replay import task_parquet

ROWS = 6_000
EPOCH_US = 1_700_000_000_000_000
SCHEMA = StructType(
    [
        StructField("topic", StringType()),
        StructField("message_id_str", StringType()),
        StructField("value", BinaryType()),
        StructField("properties", MapType(StringType(), StringType())),
        StructField("publish_time", TimestampType()),
        StructField("sequence_id", LongType()),
    ]
)


def _functions():
    """``(rows, tally)``, defined in a function so Spark's workers get them by value (a test module
    cannot be imported there)."""

    def rows(batches):
        """Per input id: a row of SCHEMA plus an ``even`` column that is tallied but not written."""
        for batch in batches:
            ids = batch.column(0).to_pylist()
            yield pa.RecordBatch.from_pydict(
                {
                    "topic": [f"persistent://t/n/orders-{i % 2}" for i in ids],
                    "message_id_str": [f"{i}:0:-1:0" for i in ids],
                    "value": [f'{{"order": {i}}}'.encode() for i in ids],
                    "properties": pa.array(
                        [[("ORIGIN_MESSAGE_ID", f"1:{i}"), ("__dlq.errors.class", "E")] for i in ids],
                        pa.map_(pa.string(), pa.string()),
                    ),
                    "publish_time": pa.array([EPOCH_US + i for i in ids], pa.timestamp("us", "UTC")),
                    "sequence_id": pa.array([None if i % 3 == 0 else i for i in ids], pa.int64()),
                    "even": [i % 2 == 0 for i in ids],
                }
            )

    def tally(batch: pa.RecordBatch) -> tuple[int, int]:
        return batch.num_rows, batch.column("even").true_count

    return rows, tally


def _write(spark, rows: int, partitions: int, out: Path | str, transform=None) -> list[tuple[int, int]]:
    make_rows, tally = _functions()
    frame = spark.range(rows, numPartitions=partitions)
    return task_parquet.write_in_tasks(frame, transform or make_rows, SCHEMA, str(out), tally, ("n", "even"))


def test_spark_reads_back_the_rows_the_tasks_wrote(spark, tmp_path):
    out = tmp_path / "decisions"
    frame = spark.range(ROWS, numPartitions=3)

    rows, tally = _functions()
    tallies = task_parquet.write_in_tasks(frame, rows, SCHEMA, str(out), tally, ("n", "even"))

    assert sum(t[0] for t in tallies) == ROWS
    assert sum(t[1] for t in tallies) == ROWS // 2
    assert sorted(p.name for p in out.iterdir()) == [
        "_SUCCESS",
        "part-00000.parquet",
        "part-00001.parquet",
        "part-00002.parquet",
    ]
    back = spark.read.schema(SCHEMA).parquet(str(out))
    assert back.columns == SCHEMA.names  # the tally-only column is not written
    expected = frame.mapInArrow(rows, StructType([*SCHEMA.fields, StructField("even", BooleanType())]))
    # Maps cannot be compared by Spark's set operations: compare the rows as Python values.
    assert sorted(back.collect()) == sorted(expected.drop("even").collect())
    row = back.filter("message_id_str = '43:0:-1:0'").first()
    assert row is not None
    assert row["properties"] == {"ORIGIN_MESSAGE_ID": "1:43", "__dlq.errors.class": "E"}
    assert row["publish_time"].timestamp() == pytest.approx(1_700_000_000.000043)
    assert row["sequence_id"] == 43


def test_the_files_follow_the_runs_dictionary_policy(spark, tmp_path):
    out = tmp_path / "snapshot"
    _write(spark, ROWS, 1, out)

    meta = pq.ParquetFile(out / "part-00000.parquet").metadata
    pages = {
        meta.row_group(0).column(i).path_in_schema: meta.row_group(0).column(i).has_dictionary_page
        for i in range(meta.num_columns)
    }

    assert pages["topic"] is True
    assert pages["properties.key_value.key"] is True
    for column in ("message_id_str", "value", "properties.key_value.value", "publish_time", "sequence_id"):
        assert pages[column] is False, column
    assert meta.row_group(0).column(0).compression == "SNAPPY"


def test_an_empty_partition_writes_an_empty_file_that_reads_back(spark, tmp_path):
    out = tmp_path / "empty"
    tallies = _write(spark, 0, 2, out)

    assert tallies == []
    assert (out / "_SUCCESS").exists()
    assert spark.read.schema(SCHEMA).parquet(str(out)).count() == 0


def test_the_folder_is_replaced_not_added_to(spark, tmp_path):
    out = tmp_path / "again"
    out.mkdir()
    (out / "part-00007.parquet").write_bytes(b"left by an earlier attempt")

    _write(spark, 10, 1, out)

    assert sorted(p.name for p in out.iterdir()) == ["_SUCCESS", "part-00000.parquet"]


def test_a_failing_task_fails_the_job_and_leaves_no_file_and_no_success(spark, tmp_path):
    out = tmp_path / "failed"

    rows, _ = _functions()

    def broken(batches):
        yield from rows(batches)
        raise RuntimeError("the fix blew up")

    with pytest.raises(Exception, match="the fix blew up"):
        _write(spark, 10, 1, out, broken)

    assert list(out.iterdir()) == []


def test_side_outputs_are_written_and_committed_with_the_main_file(spark, tmp_path):
    out, side = tmp_path / "snapshot", tmp_path / "ids"
    side_schema = StructType([StructField("message_id_str", StringType())])
    rows, tally = _functions()

    def ids(batch):
        return batch.select(["message_id_str"])

    sides = [task_parquet.SideOutput(str(side), side_schema, ids)]
    frame = spark.range(ROWS, numPartitions=2)
    task_parquet.write_in_tasks(frame, rows, SCHEMA, str(out), tally, ("n", "even"), sides=sides)

    assert sorted(p.name for p in side.iterdir()) == ["_SUCCESS", "part-00000.parquet", "part-00001.parquet"]
    main_ids = [r[0] for r in spark.read.schema(SCHEMA).parquet(str(out)).select("message_id_str").collect()]
    side_ids = [r[0] for r in spark.read.schema(side_schema).parquet(str(side)).collect()]
    assert sorted(side_ids) == sorted(main_ids)
    assert len(side_ids) == ROWS

    def broken(batches):
        yield from rows(batches)
        raise RuntimeError("the read failed")

    # One task, so no other task of the failed job is still writing when the job fails.
    one = spark.range(ROWS, numPartitions=1)
    with pytest.raises(Exception, match="the read failed"):
        task_parquet.write_in_tasks(one, broken, SCHEMA, str(out), tally, ("n", "even"), sides=sides)
    assert list(out.iterdir()) == list(side.iterdir()) == []


def test_a_retried_attempt_replaces_its_partitions_file(tmp_path):
    schema = pa.schema([("message_id_str", pa.string())])
    first = task_parquet.TaskFile(str(tmp_path), 3, 0, schema)
    first.write(pa.RecordBatch.from_pydict({"message_id_str": ["a", "b"]}, schema=schema))
    first.commit()
    killed = task_parquet.TaskFile(str(tmp_path), 3, 1, schema)
    killed.write(pa.RecordBatch.from_pydict({"message_id_str": ["x"]}, schema=schema))
    killed.discard()
    second = task_parquet.TaskFile(str(tmp_path), 3, 2, schema)
    second.write(pa.RecordBatch.from_pydict({"message_id_str": ["a", "b", "c"]}, schema=schema))

    assert pq.read_table(tmp_path / "part-00003.parquet").num_rows == 2  # until the retry commits
    second.commit()

    assert [p.name for p in Path(tmp_path).iterdir()] == ["part-00003.parquet"]
    assert pq.read_table(tmp_path / "part-00003.parquet").column(0).to_pylist() == ["a", "b", "c"]


def test_a_dataset_written_by_tasks_reads_back_through_tasks(spark, tmp_path):
    """``write_frame`` then ``read_frame`` give the same rows; a ``column=value`` folder fills a column
    the files do not hold (as Spark's reader does), and a missing dataset reads as no rows."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType
    from pyspark.testing import assertDataFrameEqual

    schema = StructType([StructField("k", StringType()), StructField("n", LongType())])
    rows = spark.createDataFrame([("a", 1), ("b", 2), (None, 3)], schema)
    folder = tmp_path / "data" / "run_id=r%3A1"
    assert task_parquet.write_frame(rows, str(folder), schema) == 3
    assertDataFrameEqual(task_parquet.read_frame(spark, str(folder), schema), rows)
    with_run = StructType([*schema.fields, StructField("run_id", StringType())])
    read = task_parquet.read_frame(spark, str(tmp_path / "data"), with_run)
    assert sorted(r["run_id"] for r in read.collect()) == ["r:1"] * 3
    assert task_parquet.read_frame(spark, str(tmp_path / "missing"), schema).count() == 0
