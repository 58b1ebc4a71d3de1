"""``mapInArrow`` / ``applyInArrow`` without pandas, and small driver-side frames without a Python RDD.

PySpark 4.3 implements both on top of ``pandas_udf``, which refuses to run unless pandas is installed,
although Arrow-only UDFs never use pandas on the driver or the executors. This project does not need
pandas, so when it is missing these helpers build the same Arrow UDF without the pandas check (the
public API is used whenever pandas is importable).

:func:`local_frame` builds a DataFrame from a few driver-side rows through Arrow: from a Python list
PySpark converts the rows in a Python RDD, whose workers Spark keeps in a pool of their own (an RDD's
workers lack the SQL workers' environment), so the run would start a second Python daemon and two more
workers for a handful of rows.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import pyarrow as pa
    from pyspark.sql import DataFrame, GroupedData, SparkSession
    from pyspark.sql.types import StructType


def _has_pandas() -> bool:
    return importlib.util.find_spec("pandas") is not None


def _arrow_udf(func: Callable[..., Any], schema: StructType | str, eval_type: int) -> Any:
    from pyspark.sql.pandas.functions import vectorized_udf  # type: ignore[attr-defined]

    return vectorized_udf(func, returnType=schema, functionType=eval_type, kind="pandas")


def map_in_arrow(df: DataFrame, func: Callable[..., Any], schema: StructType | str) -> DataFrame:
    """``df.mapInArrow(func, schema)``, also when pandas is not installed."""
    if _has_pandas():
        return df.mapInArrow(func, schema)
    from pyspark.sql import DataFrame as SparkDataFrame
    from pyspark.util import PythonEvalType

    udf = _arrow_udf(func, schema, PythonEvalType.SQL_MAP_ARROW_ITER_UDF)
    column = udf(*[df[name] for name in df.columns])
    return SparkDataFrame(df._jdf.mapInArrow(column._jc, False, None), df.sparkSession)


def apply_in_arrow(grouped: GroupedData, func: Callable[..., Any], schema: StructType | str) -> DataFrame:
    """``grouped.applyInArrow(func, schema)`` (func: ``pyarrow.Table -> pyarrow.Table``), without pandas."""
    if _has_pandas():
        return grouped.applyInArrow(func, schema)
    from pyspark.sql import DataFrame as SparkDataFrame
    from pyspark.util import PythonEvalType

    df = grouped._df
    udf = _arrow_udf(func, schema, PythonEvalType.SQL_GROUPED_MAP_ARROW_UDF)
    column = udf(*[df[name] for name in df.columns])
    return SparkDataFrame(grouped._jgd.flatMapGroupsInArrow(column._jc), grouped.session)


def local_frame(spark: SparkSession, rows: Sequence[Sequence[Any]], schema: str) -> DataFrame:
    """``spark.createDataFrame(rows, schema)`` (``schema`` in DDL) through Arrow: no Python worker runs."""
    import pyarrow as pa

    from spark_apps.dlq_replay.schemas import arrow_schema

    struct = _struct(schema)
    table = pa.Table.from_pylist(
        [dict(zip(struct.names, row, strict=True)) for row in rows], arrow_schema(struct)
    )
    return spark.createDataFrame(table, schema=struct)


def arrow_frame(spark: SparkSession, table: pa.Table, schema: str) -> DataFrame:
    """A DataFrame of a driver's ``pyarrow.Table``, its columns cast to ``schema`` (DDL)."""
    from spark_apps.dlq_replay.schemas import arrow_schema

    struct = _struct(schema)
    return spark.createDataFrame(table.select(struct.names).cast(arrow_schema(struct)), schema=struct)


def _struct(schema: str) -> StructType:
    from pyspark.sql.types import StructType

    struct = StructType.fromDDL(schema)
    if not isinstance(struct, StructType):  # pragma: no cover - a DDL column list is always a struct
        raise TypeError(f"a DDL column list is needed, got {schema!r}")
    return struct
