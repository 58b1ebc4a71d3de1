"""A lean Spark driver for a local replay (the driver JVM is the executor too), and the C1-only JIT for a
small run. What the user sets wins; a cluster master is left alone. See ``docs/operator.md``."""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Literal

from airflow_provider_dlq.class_data import DRIVER_JAVA_OPTIONS, with_driver_java_option

if TYPE_CHECKING:
    from collections.abc import Mapping

QuickJit = bool | Literal["auto"]

DRIVER_MEMORY = "spark.driver.memory"
#: Driver heap per core of a local master, and the least it gets.
LEAN_HEAP_MIB_PER_CORE = 256
LEAN_HEAP_MIN_MIB = 512
SERIAL_GC_OPTION = "-XX:+UseSerialGC"
#: The serial collector's young generation: an eighth of the heap, not its default third.
LEAN_YOUNG_OPTION = "-XX:NewRatio=7"
MALLOC_ARENA_MAX = "MALLOC_ARENA_MAX"
LEAN_MALLOC_ARENAS = "2"
#: Spark SQL's query-stage thread pools (static confs, so set at submit).
STAGE_THREAD_CONFS = (
    "spark.sql.resultQueryStage.maxThreadThreshold",
    "spark.sql.shuffleExchange.maxThreadThreshold",
    "spark.sql.broadcastExchange.maxThreadThreshold",
)
LEAN_STAGE_THREADS = "16"
#: JVM options that show the user chose the young generation's size, or the collector.
_USER_YOUNG_OPTIONS = ("NewRatio", "NewSize", "-Xmn")
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
QUICK_JIT_OPTION = "-XX:TieredStopAtLevel=1"
#: JVM options that show the user chose the JIT already (then nothing is added).
_USER_JIT_OPTIONS = ("TieredStopAtLevel", "TieredCompilation")


def local_cores(master: str) -> int | None:
    """Cores of a ``local``, ``local[N]``, ``local[*]`` or ``local[N,F]`` master; else ``None``."""
    if (found := _LOCAL_MASTER.fullmatch(master.strip())) is None:
        return None
    cores = found.group(1) or "1"
    return (os.cpu_count() or 1) if cores == "*" else max(1, int(cores))


def lean_driver_conf(conf: Mapping[str, str], master: str) -> dict[str, str]:
    """A copy of ``conf`` with the lean settings for a local ``master``; what ``conf`` sets stays."""
    cores = local_cores(master)
    if cores is None:
        return {str(k): str(v) for k, v in conf.items()}
    merged = with_driver_java_option(conf, SERIAL_GC_OPTION, _USER_GC_OPTIONS)
    if merged.get(DRIVER_JAVA_OPTIONS) != conf.get(DRIVER_JAVA_OPTIONS):  # the serial collector was added
        merged = with_driver_java_option(merged, LEAN_YOUNG_OPTION, _USER_YOUNG_OPTIONS)
    heap = f"{max(LEAN_HEAP_MIN_MIB, LEAN_HEAP_MIB_PER_CORE * cores)}m"
    return {DRIVER_MEMORY: heap, **dict.fromkeys(STAGE_THREAD_CONFS, LEAN_STAGE_THREADS), **merged}


def lean_driver_env(env: Mapping[str, str], master: str) -> dict[str, str]:
    """``env`` with :data:`LEAN_MALLOC_ARENAS` malloc arenas for a local ``master``, unless set already."""
    if local_cores(master) is None or MALLOC_ARENA_MAX in os.environ:
        return dict(env)
    return {MALLOC_ARENA_MAX: LEAN_MALLOC_ARENAS, **env}


def quick_jit_chosen(setting: QuickJit, master: str) -> bool:
    """``setting`` when a bool; for ``"auto"``, whether ``master`` is local (its driver JVM runs the tasks,
    whose work is in Python: C2's compiling costs more than it wins at every size measured)."""
    if isinstance(setting, bool):
        return setting
    return local_cores(master) is not None


def with_quick_jit(conf: Mapping[str, str]) -> dict[str, str]:
    """``conf`` with :data:`QUICK_JIT_OPTION`, unless the user's JVM options choose the JIT."""
    return with_driver_java_option(conf, QUICK_JIT_OPTION, _USER_JIT_OPTIONS)
