"""parquet_writer: the run's Parquet datasets keep no dictionary for per-message columns (payloads, ids,
the context properties' values) and keep it for the columns with few values (topics, property keys)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
from pyspark.sql import functions as F

from spark_apps.dlq_replay.parquet_writes import parquet_writer

ROWS = 5_000


def _dictionary_pages(path: Path) -> dict[str, bool]:
    """Column path -> whether its chunk has a dictionary page, in every file written."""
    seen: dict[str, bool] = {}
    files = sorted(path.glob("**/*.parquet"))
    assert files, f"no Parquet files under {path}"
    for file in files:
        meta = pq.ParquetFile(file).metadata
        for group in range(meta.num_row_groups):
            for index in range(meta.num_columns):
                column = meta.row_group(group).column(index)
                name = column.path_in_schema
                seen[name] = seen.get(name, False) or column.has_dictionary_page
    return seen


def _frame(spark):
    ids = spark.range(ROWS)
    return ids.select(
        F.concat(F.lit("persistent://t/n/orders-"), (F.col("id") % 2).cast("string")).alias("topic"),
        F.concat(F.lit("ledger:"), F.col("id").cast("string")).alias("message_id_str"),
        F.concat(F.lit('{"order": '), F.col("id").cast("string"), F.lit("}")).cast("binary").alias("value"),
        F.create_map(
            F.lit("ORIGIN_MESSAGE_ID"),
            F.concat(F.lit("1:"), F.col("id").cast("string")),
            F.lit("__dlq.errors.class"),
            F.lit("ValueError"),
        ).alias("properties"),
        F.timestamp_seconds(F.lit(1_700_000_000) + F.col("id")).alias("publish_time"),
    )


def test_per_message_columns_have_no_dictionary_and_the_others_keep_it(spark, tmp_path):
    out = tmp_path / "snapshot"
    parquet_writer(_frame(spark)).mode("overwrite").parquet(str(out))

    pages = _dictionary_pages(out)

    assert pages["topic"] is True
    assert pages["properties.key_value.key"] is True
    for column in ("message_id_str", "value", "properties.key_value.value", "publish_time"):
        assert pages[column] is False, column


def test_plain_spark_keeps_a_dictionary_for_the_properties_values(spark, tmp_path):
    """What the writer avoids: with Spark's default the properties' values, half of them repeated, keep a
    dictionary (every value hashed); columns of unique values give theirs up after the first page."""
    out = tmp_path / "default"
    _frame(spark).write.mode("overwrite").parquet(str(out))

    pages = _dictionary_pages(out)

    assert pages["properties.key_value.value"] is True
    assert pages["value"] is False


def test_partitioned_writes_keep_the_options_and_the_rows_read_back(spark, tmp_path):
    out = tmp_path / "ledger"
    frame = _frame(spark).withColumn("run_id", F.lit("run-1"))
    parquet_writer(frame).mode("overwrite").option("partitionOverwriteMode", "dynamic").partitionBy(
        "run_id"
    ).parquet(str(out))

    assert _dictionary_pages(out)["value"] is False
    back = spark.read.parquet(str(out))
    assert back.count() == ROWS
    row = back.filter(F.col("properties")["ORIGIN_MESSAGE_ID"] == "1:42").select("message_id_str").first()
    assert row is not None
    assert row[0] == "ledger:42"
