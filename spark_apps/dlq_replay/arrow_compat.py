"""Arrow UDFs and small driver-side frames through the public DataFrame API (classic and Spark Connect).

PySpark builds ``df.mapInArrow`` and ``grouped.applyInArrow`` on ``pandas_udf``, which checks that pandas
is installed on the driver although Arrow-only UDFs never use it on the driver or the executors;
:func:`require_arrow_udfs` makes that check before a run starts, naming the fix (a Spark Connect client
needs pandas anyway).

:func:`local_frame` and :func:`arrow_frame` build a DataFrame from a few driver-side rows through Arrow:
a local relation, on a classic session and under Spark Connect alike. From a Python list a classic
session would convert the rows in a Python RDD, whose workers Spark keeps in a pool of their own, so
the run would start a second Python daemon and two more workers for a handful of rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from collections.abc import Sequence

    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType


def require_arrow_udfs() -> None:
    """Raise :class:`~spark_apps.dlq_replay.errors.ReplayConfigError` naming the fix when this Python
    cannot create PySpark's Arrow UDFs (the pandas check of ``mapInArrow``/``applyInArrow``)."""
    from spark_apps.dlq_replay.errors import ReplayConfigError

    try:
        from pyspark.sql.pandas.utils import require_minimum_pandas_version

        require_minimum_pandas_version()
    except ImportError as exc:  # PySparkImportError is one
        raise ReplayConfigError(
            f"the driver's Python cannot run PySpark's mapInArrow/applyInArrow ({exc}); install pandas "
            "in the driver's environment (pip install 'pandas>=2.2,<3'); the executors do not need it"
        ) from exc


def local_frame(spark: SparkSession, rows: Sequence[Sequence[Any]], schema: str) -> DataFrame:
    """``spark.createDataFrame(rows, schema)`` (``schema`` in DDL) through Arrow: no Python worker runs."""
    import pyarrow as pa

    struct, arrow = _schemas(schema)
    table = pa.Table.from_pylist([dict(zip(struct.names, row, strict=True)) for row in rows], arrow)
    return spark.createDataFrame(table, schema=struct)


def arrow_frame(spark: SparkSession, table: pa.Table, schema: str) -> DataFrame:
    """A DataFrame of a driver's ``pyarrow.Table``, its columns cast to ``schema`` (DDL)."""
    struct, arrow = _schemas(schema)
    return spark.createDataFrame(table.select(struct.names).cast(arrow), schema=struct)


def _schemas(ddl: str) -> tuple[StructType, pa.Schema]:
    """``ddl`` as a Spark and an Arrow schema (UTC timestamps, as ``schemas.arrow_schema``, which imports
    this module through the Pulsar source)."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    struct = cast("StructType", StructType.fromDDL(ddl))  # a DDL column list is always a struct
    return struct, to_arrow_schema(struct, timezone="UTC")
