"""``mapInArrow`` / ``applyInArrow`` without pandas.

PySpark 4.3 implements both on top of ``pandas_udf``, which refuses to run unless pandas is installed,
although Arrow-only UDFs never use pandas on the driver or the executors. This project does not need
pandas, so when it is missing these helpers build the same Arrow UDF without the pandas check (the
public API is used whenever pandas is importable).
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame, GroupedData
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
