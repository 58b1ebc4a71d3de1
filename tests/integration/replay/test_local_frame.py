"""local_frame: a few driver-side rows as a DataFrame through Arrow, planned as a local scan (no Python
RDD, so no second pool of Python workers), with the DDL schema's types and nulls."""

from __future__ import annotations

from pyspark.sql.types import StructType

from spark_apps.dlq_replay.arrow_util import local_frame

SCHEMA = "dlq_topic string, ledger_id long, messages long"


def _plan(df) -> str:
    return str(df._jdf.queryExecution().executedPlan().toString())


def test_the_rows_come_back_with_the_ddl_schema_and_their_nulls(spark):
    df = local_frame(spark, [("t-0", None, 0), ("t-1", 7, 3)], SCHEMA)

    assert df.schema == StructType.fromDDL(SCHEMA)
    assert [tuple(r) for r in df.orderBy("dlq_topic").collect()] == [("t-0", None, 0), ("t-1", 7, 3)]


def test_no_rows_give_an_empty_frame_with_the_schema(spark):
    df = local_frame(spark, [], SCHEMA)

    assert df.schema == StructType.fromDDL(SCHEMA)
    assert df.count() == 0


def test_the_rows_are_a_local_scan_not_a_python_rdd(spark):
    arrow = local_frame(spark, [("t-0", 1, 2)], SCHEMA)
    from_list = spark.createDataFrame([("t-0", 1, 2)], SCHEMA)

    assert "LocalTableScan" in _plan(arrow)
    assert "ExistingRDD" not in _plan(arrow)
    # What local_frame avoids: from a Python list PySpark scans a Python RDD.
    assert "ExistingRDD" in _plan(from_list)
