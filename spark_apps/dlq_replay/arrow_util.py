"""Small pyarrow helpers: the batch kernels' shared array functions (no Python object per value), and
Arrow UDFs and small driver-side frames through the public DataFrame API (classic and Spark Connect)."""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence

    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType


def use_jemalloc_pool() -> None:
    """Allocate this process's Arrow buffers with jemalloc, which reuses a freed batch's pages for the next
    and returns them within seconds (mimalloc kept them; malloc mapping large blocks paid page faults on
    every batch). A pyarrow without jemalloc keeps its default pool, said once."""
    try:
        pool = pa.jemalloc_memory_pool()
    except NotImplementedError:
        _warn_no_jemalloc()
        return
    pa.set_memory_pool(pool)


@functools.cache
def _warn_no_jemalloc() -> None:
    """Say once per process that this pyarrow has no jemalloc, what that costs and how to get it."""
    logging.getLogger("spark_apps.dlq_replay").warning(
        "this pyarrow (%s) was built without jemalloc: Arrow buffers stay in its %s pool, which keeps "
        "freed batches resident (more memory per Python worker); install pyarrow's wheel from PyPI",
        pa.__version__,
        pa.default_memory_pool().backend_name,
    )


@contextlib.contextmanager
def rare_collections() -> Iterator[None]:
    """Run a Python task with the cyclic garbage collector seldom (its live objects frozen, thresholds
    :data:`TASK_GC_THRESHOLD`): with Python's defaults a send task spent a tenth of its time collecting."""
    threshold = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(*TASK_GC_THRESHOLD)
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


def return_free_memory() -> None:
    """Hand the memory the driver freed back to the system, else what one step frees stays resident."""
    pa.default_memory_pool().release_unused()
    gc.collect()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


@functools.cache
def _glibc() -> Any:
    """The C library when it is glibc (it has ``malloc_trim``), else ``None``."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


#: The collector's thresholds while a task runs (Python's are 700, 10, 10).
TASK_GC_THRESHOLD = (20_000, 20, 100)


def row_numbers(n: int) -> pa.Array:
    """``0, 1, ... n - 1`` as int64."""
    return pa.array(np.arange(n, dtype=np.int64))


def prefix_counts(flags: pa.Array) -> pa.Array:
    """``[0, f0, f0 + f1, ...]``: the true ``flags`` before each position, then all of them."""
    return pa.concat_arrays([pa.array([0], pa.int64()), pc.cumulative_sum(pc.cast(flags, pa.int64()))])


def per_distinct(values: pa.Array, function: Callable[[Any], Any], out_type: pa.DataType) -> pa.Array:
    """``function`` of every value (null included), called once per distinct value."""
    encoded = values.dictionary_encode(null_encoding="encode")
    results = pa.array([function(value) for value in encoded.dictionary.to_pylist()], out_type)
    return results.take(encoded.indices)


def map_entries(properties: pa.Array) -> tuple[pa.Array, pa.Array, pa.Array, pa.Array]:
    """``(keys, items, row of each entry, offsets from 0)`` of the entries of a map column (a sliced one
    too: its offsets index the whole key and item children)."""
    offsets = properties.offsets
    start, end = offsets[0].as_py(), offsets[-1].as_py()
    keys, items = properties.keys.slice(start, end - start), properties.items.slice(start, end - start)
    relative = pc.subtract(offsets, pa.scalar(start, offsets.type)) if start else offsets
    rows = pc.list_parent_indices(pa.ListArray.from_arrays(relative, pa.nulls(end - start)))
    return keys, items, rows, relative


def group_ids(columns: Sequence[pa.Array]) -> pa.Array:
    """An int64 id per row, below the number of rows, the same for rows equal in every one of ``columns``."""
    ids = pa.repeat(pa.scalar(0, pa.int64()), len(columns[0]))
    for column in columns:
        values = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        encoded = values.dictionary_encode(null_encoding="encode")
        combined = pc.add(pc.multiply(ids, len(encoded.dictionary)), pc.cast(encoded.indices, pa.int64()))
        ids = pc.cast(combined.dictionary_encode().indices, pa.int64())
    return ids


class SortedKeys:
    """String keys indexed once by a sort: a lookup is a binary search per wanted key (no hash table per
    batch); a key present several times answers with its first position, as a hash lookup would."""

    def __init__(self, keys: pa.Array | pa.ChunkedArray) -> None:
        values = _byte_keys(keys)
        self.order = np.argsort(values, kind="stable")
        self.sorted = values[self.order]

    def positions(self, wanted: pa.Array | pa.ChunkedArray) -> pa.Array:
        """The position of each of ``wanted`` among the keys (int64; null when absent or null)."""
        if not len(self.sorted):
            return pa.nulls(len(wanted), pa.int64())
        keys = _byte_keys(wanted)
        at = np.minimum(np.searchsorted(self.sorted, keys), len(self.sorted) - 1)
        hit = (self.sorted[at] == keys) & pc.is_valid(wanted).to_numpy(zero_copy_only=False)
        return pa.array(self.order[at], pa.int64(), mask=~hit)


_FNV_OFFSET, _FNV_PRIME = np.uint64(0xCBF29CE484222325), np.uint64(0x100000001B3)


def key_hashes(keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A 64-bit FNV-1a hash of each key, over its bytes padded with NUL to the longest (null: empty)."""
    values = _byte_keys(keys)
    hashes = np.full(len(values), _FNV_OFFSET, np.uint64)
    for column in values.view(np.uint8).reshape(len(values), values.dtype.itemsize).T:
        hashes ^= column
        hashes *= _FNV_PRIME
    return hashes


def _byte_keys(keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """``keys`` as a NumPy bytes array (null: empty), no Python object per key: the data buffer as it is when
    every key has one length (replay ids do), else the keys padded with NUL bytes to the longest."""
    values = pc.fill_null(keys.cast(pa.binary()), b"")
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not len(values):
        return np.array([], dtype="S1")
    lengths = pc.binary_length(values)
    shortest, width = pc.min_max(lengths).values()
    width = max(1, width.as_py())
    if shortest.as_py() == width:
        start = pa.Array.from_buffers(pa.int32(), 1, [None, values.buffers()[1]], offset=values.offset)[0]
        return np.frombuffer(values.buffers()[2], dtype=f"S{width}", count=len(values), offset=start.as_py())
    pads = pc.binary_repeat(pa.scalar(b"\x00"), pc.subtract(pa.scalar(width, lengths.type), lengths))
    padded = pc.binary_join_element_wise(values, pads, pa.scalar(b""))
    return np.frombuffer(padded.buffers()[2], dtype=f"S{width}", count=len(padded))


def require_arrow_udfs() -> None:
    """Refuse, naming the fix, a driver without pandas: PySpark's ``mapInArrow``/``applyInArrow`` check it
    although Arrow UDFs never use it."""
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
    """``spark.createDataFrame(rows, schema)`` (``schema`` in DDL) through Arrow: a local relation, where a
    Python list would start a second Python daemon and workers on a classic session."""
    struct, arrow = _schemas(schema)
    table = pa.Table.from_pylist([dict(zip(struct.names, row, strict=True)) for row in rows], arrow)
    return spark.createDataFrame(table, schema=struct)


def in_tasks(
    spark: SparkSession, work: Callable[[int], Iterable[pa.RecordBatch]], tasks: int, schema: StructType
) -> pa.Table:
    """The rows (``schema``) of ``work(i)`` for each ``i`` below ``tasks``, each in its own Python task."""
    if tasks < 1:
        from spark_apps.dlq_replay.schemas import arrow_schema

        return arrow_schema(schema).empty_table()
    return spark.range(tasks, numPartitions=tasks).mapInArrow(each_id(work), schema).toArrow()


def each_id(
    work: Callable[[int], Iterable[pa.RecordBatch]],
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function over ``spark.range`` rows that yields ``work(i)`` for each id ``i``."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for i in batch.column(0).to_pylist():
                yield from work(i)

    return run


def arrow_frame(spark: SparkSession, table: pa.Table, schema: str) -> DataFrame:
    """A DataFrame of a driver's ``pyarrow.Table``, its columns cast to ``schema`` (DDL)."""
    struct, arrow = _schemas(schema)
    return spark.createDataFrame(table.select(struct.names).cast(arrow), schema=struct)


def _schemas(ddl: str) -> tuple[StructType, pa.Schema]:
    """``ddl`` as a Spark and an Arrow schema (UTC timestamps, as ``schemas.arrow_schema``)."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    struct = cast("StructType", StructType.fromDDL(ddl))  # a DDL column list is always a struct
    return struct, to_arrow_schema(struct, timezone="UTC")
