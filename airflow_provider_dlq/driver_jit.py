"""Quick JIT for a small replay's Spark driver JVM: C1 only (``-XX:TieredStopAtLevel=1``).

A replay's driver JVM lives for one run, and with a local master it is the executor too. Its C2
compiler spends CPU on optimising Spark's, Parquet's and Arrow's hot paths, which a small run uses only
briefly; on a 2-core worker that CPU is taken from the run's own tasks. With C1 alone the JVM compiles
far less (a 100k decide pass: 47 -> 31 s of JVM CPU), so a small run finishes sooner, while a large run
loses C2's faster code. Measured on Apache Pulsar, ``local[2]``:
10k 32.0-39.9 -> 24.1-30.3 s, 100k 65.5 -> 63.0 s, but 1M 330.6 -> 396.8 s.

``"auto"``, the operator's and the benchmark's default, turns it on for a local master when the run's
size is known exactly and at most :data:`QUICK_JIT_MAX_MESSAGES` messages (the operator reads it from the
subscription's backlog; a backlog that counts entries is only a lower bound, so it leaves the JIT alone).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from airflow_provider_dlq.class_data import with_driver_java_option

if TYPE_CHECKING:
    from collections.abc import Mapping

QuickJit = bool | Literal["auto"]

QUICK_JIT_OPTION = "-XX:TieredStopAtLevel=1"
#: Largest run (messages) for which ``"auto"`` chooses the quick JIT: faster at 10k and 100k, slower at 1M.
QUICK_JIT_MAX_MESSAGES = 100_000
#: JVM options that show the user chose the JIT already (then nothing is added).
_USER_JIT_OPTIONS = ("TieredStopAtLevel", "TieredCompilation")


def quick_jit_chosen(setting: QuickJit, master: str, messages: int | None, exact: bool) -> bool:
    """Whether the driver JVM gets :data:`QUICK_JIT_OPTION`: ``setting`` when it is a bool; for
    ``"auto"``, a local ``master`` and an ``exact`` count of at most :data:`QUICK_JIT_MAX_MESSAGES`."""
    if isinstance(setting, bool):
        return setting
    small = messages is not None and messages <= QUICK_JIT_MAX_MESSAGES
    return master.startswith("local") and exact and small


def with_quick_jit(conf: Mapping[str, str]) -> dict[str, str]:
    """``conf`` with :data:`QUICK_JIT_OPTION` after the driver's JVM options; unchanged when those
    choose the JIT themselves."""
    return with_driver_java_option(conf, QUICK_JIT_OPTION, _USER_JIT_OPTIONS)
