"""Quick JIT for a small replay's Spark driver JVM: C1 only (``-XX:TieredStopAtLevel=1``).

A small run finishes sooner with C1 alone, a large one later (``docs/operator.md``), so ``"auto"`` turns
it on for a local master when the run's size is known exactly and at most :data:`QUICK_JIT_MAX_MESSAGES`.
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
    """``setting`` when a bool; for ``"auto"``, a local ``master`` and an exact, small enough count."""
    if isinstance(setting, bool):
        return setting
    small = messages is not None and messages <= QUICK_JIT_MAX_MESSAGES
    return master.startswith("local") and exact and small


def with_quick_jit(conf: Mapping[str, str]) -> dict[str, str]:
    """``conf`` with :data:`QUICK_JIT_OPTION`, unless the user's JVM options choose the JIT."""
    return with_driver_java_option(conf, QUICK_JIT_OPTION, _USER_JIT_OPTIONS)
