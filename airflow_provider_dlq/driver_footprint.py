"""A lean Spark driver for a local replay: a heap sized to its cores, the serial collector with a small young
generation, two malloc arenas, bounded query-stage thread pools.

With a local master the driver JVM is the executor too, and with the Python workers it is all of a
run's memory. Spark's and the JVM's defaults are sized for long-lived servers: a 1 GiB heap that G1 fills
before it collects, G1's own threads and tables, and glibc's up to eight malloc arenas per core for the
JVM's and the workers' native buffers. A replay streams its data and keeps little on the heap, so for a
local master :func:`lean_driver_conf` and :func:`lean_driver_env` give the driver
:data:`LEAN_HEAP_MIB_PER_CORE` MiB of heap per core (at least :data:`LEAN_HEAP_MIN_MIB`), the serial
collector with an eighth of the heap young (:data:`LEAN_YOUNG_OPTION`), :data:`LEAN_MALLOC_ARENAS` malloc
arenas and at most :data:`LEAN_STAGE_THREADS` threads in each of Spark SQL's query-stage pools
(:data:`STAGE_THREAD_CONFS`). Those pools add a thread for every stage until they hold the threshold
(1,024 for shuffle and result stages), and an idle thread lives 60 s: a 1M replay on pulsar-lite, which
sends in 100 waves of a few jobs each, had 600 driver threads and about 190 MiB more resident memory by
the end of its sends. Measured on Apache Pulsar, ``local[2]``, with the app's smaller Arrow batches
and row groups: the run's peak memory at 1M 2,858 -> 1,606 MiB, at 100k 2,124 -> 1,465 MiB, and the
JVM starts and stops 1.5-2.5 s sooner with the serial collector.

Whatever the user sets wins: ``spark.driver.memory`` in ``conf`` (or ``driver_memory``), a collector or
a young generation's size in ``spark.driver.extraJavaOptions``, ``MALLOC_ARENA_MAX`` in ``env_vars``, a
pool's threshold in ``conf``. A cluster master is left alone: there the executors do the work, with their
own settings.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from airflow_provider_dlq.class_data import DRIVER_JAVA_OPTIONS, with_driver_java_option

if TYPE_CHECKING:
    from collections.abc import Mapping

DRIVER_MEMORY = "spark.driver.memory"
#: Driver heap per core of a local master, and the least it gets.
LEAN_HEAP_MIB_PER_CORE = 256
LEAN_HEAP_MIN_MIB = 512
SERIAL_GC_OPTION = "-XX:+UseSerialGC"
#: The serial collector's young generation: an eighth of the heap (64 MiB of 512), not its default third.
#: Every young collection touches all of eden, so eden is resident the whole run; a replay's short-lived
#: objects (Arrow batches pass through as buffers) need no more.
LEAN_YOUNG_OPTION = "-XX:NewRatio=7"
MALLOC_ARENA_MAX = "MALLOC_ARENA_MAX"
LEAN_MALLOC_ARENAS = "2"
#: Spark SQL's query-stage thread pools (static confs, so set at submit): result stages, shuffle stages,
#: broadcasts. A replay runs at most a few queries at once (``concurrent_queries.MAX_THREADS``).
STAGE_THREAD_CONFS = (
    "spark.sql.resultQueryStage.maxThreadThreshold",
    "spark.sql.shuffleExchange.maxThreadThreshold",
    "spark.sql.broadcastExchange.maxThreadThreshold",
)
LEAN_STAGE_THREADS = "16"
#: JVM options that show the user sized the young generation (then :data:`LEAN_YOUNG_OPTION` is not added).
_USER_YOUNG_OPTIONS = ("NewRatio", "NewSize", "-Xmn")
#: JVM options that show the user chose the collector already (then none is added).
_USER_GC_OPTIONS = (
    "UseSerialGC",
    "UseParallelGC",
    "UseG1GC",
    "UseZGC",
    "UseShenandoahGC",
    "UseEpsilonGC",
    "UseConcMarkSweepGC",
)
_LOCAL_MASTER = re.compile(r"local(?:\[\s*(\*|\d+)\s*(?:,\s*\d+\s*)?\])?")


def local_cores(master: str) -> int | None:
    """Cores of a ``local``, ``local[N]``, ``local[*]`` or ``local[N,F]`` master; ``None`` for any other."""
    found = _LOCAL_MASTER.fullmatch(master.strip())
    if found is None:
        return None
    cores = found.group(1)
    if cores is None:
        return 1
    if cores == "*":
        return os.cpu_count() or 1
    return max(1, int(cores))


def lean_heap(cores: int) -> str:
    """The driver heap (``spark.driver.memory``) for a local master of ``cores`` cores."""
    return f"{max(LEAN_HEAP_MIN_MIB, LEAN_HEAP_MIB_PER_CORE * cores)}m"


def lean_driver_conf(conf: Mapping[str, str], master: str) -> dict[str, str]:
    """``conf`` with the lean heap, the serial collector (with a small young generation) and bounded stage
    pools for a local ``master``; what ``conf`` sets stays (a copy is returned)."""
    cores = local_cores(master)
    if cores is None:
        return {str(k): str(v) for k, v in conf.items()}
    merged = with_driver_java_option(conf, SERIAL_GC_OPTION, _USER_GC_OPTIONS)
    if merged.get(DRIVER_JAVA_OPTIONS) != conf.get(DRIVER_JAVA_OPTIONS):  # the serial collector was added
        merged = with_driver_java_option(merged, LEAN_YOUNG_OPTION, _USER_YOUNG_OPTIONS)
    merged.setdefault(DRIVER_MEMORY, lean_heap(cores))
    for name in STAGE_THREAD_CONFS:
        merged.setdefault(name, LEAN_STAGE_THREADS)
    return merged


def lean_driver_env(env: Mapping[str, str], master: str) -> dict[str, str]:
    """spark-submit's environment ``env`` with :data:`LEAN_MALLOC_ARENAS` malloc arenas for a local
    ``master`` (the driver JVM and its Python workers inherit it); a value in ``env`` or in this
    process's environment stays."""
    merged = dict(env)
    if local_cores(master) is not None and MALLOC_ARENA_MAX not in os.environ:
        merged.setdefault(MALLOC_ARENA_MAX, LEAN_MALLOC_ARENAS)
    return merged
