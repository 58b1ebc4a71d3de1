"""The next try of a killed replay task waits for the earlier attempt of the same run, then runs it again."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from airflow.sdk.exceptions import AirflowException

from airflow_provider_dlq.errors import DlqProviderError
from airflow_provider_dlq.output_storage import split_location
from pulsar_dlq_consumer.replay_lock import (
    LEASE_SUBSCRIPTION,
    LOCK_PREFIX,
    LockOwner,
    lease_topic,
    lock_generation,
    pid_alive,
)
from pulsar_dlq_consumer.replay_lock import lease_holder as describe_lease_holder

if TYPE_CHECKING:
    import logging
    from collections.abc import Callable, Sequence

    from airflow.sdk.types import Logger

#: Seconds between two looks at the lock and the lease while waiting (the app's heartbeat is 10 s).
POLL_S = 5.0
#: How often (seconds) a long wait says it is still waiting.
PROGRESS_EVERY_S = 60.0


class OtherRunHoldsError(DlqProviderError, AirflowException):
    """A different replay run holds the output directory or a DLQ topic's lease."""


class ReattachTimeoutError(DlqProviderError, AirflowException):
    """The earlier attempt of this run still runs after ``reattach_timeout``."""


@dataclass(frozen=True)
class RunHolder:
    """A live replay run holding what this run needs: ``who`` describes it, ``where`` is the lock or lease."""

    run_id: str
    who: str
    where: str

    def describe(self) -> str:
        return f"{self.who} holding {self.where}"


def output_lock_holder(
    output_dir: str, alive: Callable[[int, str | None], bool] = pid_alive
) -> RunHolder | None:
    """The run holding the output directory lock, unless it is absent or stale (as the app decides)."""
    scheme, root = split_location(output_dir)
    if scheme:  # an object store, where the app holds no lock
        return None
    locks = Path(root) / "locks"
    try:
        generations = [g for g in map(lock_generation, (p.name for p in locks.iterdir())) if g is not None]
        owner = LockOwner.from_json((locks / f"{LOCK_PREFIX}{max(generations)}").read_text())
    except (OSError, ValueError):  # no lock, or one being replaced or released right now
        return None
    if owner is None or owner.stale_reason(time.time(), alive=alive):
        return None
    return RunHolder(owner.run_id, owner.describe(), f"the output directory lock of {output_dir}")


def lease_holder(
    topics: Sequence[str], consumers: Callable[[str, str], list[dict[str, str]]]
) -> RunHolder | None:
    """The first run holding a lease of ``topics``; ``consumers`` reads the lease consumers' properties."""
    for topic in topics:
        for meta in consumers(lease_topic(topic), LEASE_SUBSCRIPTION):
            if who := describe_lease_holder(meta):
                return RunHolder(meta["run_id"], who, f"the lease on DLQ topic {topic}")
    return None


def find_holder(
    output_dir: str,
    topics: Sequence[str],
    consumers: Callable[[str, str], list[dict[str, str]]] | None,
    log: Logger | logging.Logger,
) -> RunHolder | None:
    """The live run holding the output lock or (with ``consumers``) a lease of ``topics``, or ``None``."""
    if (holder := output_lock_holder(output_dir)) is not None or consumers is None:
        return holder
    try:
        return lease_holder(topics, consumers)
    except Exception as exc:  # a courtesy look: the app still refuses a held lease itself
        log.info("Could not read the DLQ leases' holders (%s: %s)", type(exc).__name__, exc)
        return None


def wait_for_earlier_attempt(
    run_id: str,
    find: Callable[[], RunHolder | None],
    timeout_s: float,
    log: Logger | logging.Logger,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> RunHolder | None:
    """Return once nothing holds run ``run_id`` (the earlier attempt waited for, or ``None``); fail at once
    when a different run holds it, or after ``timeout_s``."""
    started = clock()
    waited_for: RunHolder | None = None
    said = 0.0
    while (holder := find()) is not None:
        if holder.run_id != run_id:
            raise OtherRunHoldsError(
                f"Another replay run holds what run {run_id!r} needs: {holder.describe()}. This task does "
                "not wait for a different run (two runs at once would republish the same messages twice); "
                "let that run finish, then retry or clear this task."
            )
        waited = clock() - started
        if waited_for is None:
            log.info(
                "An earlier attempt of replay run %s is still running: %s (the task's previous try was "
                "killed, its Spark driver was not). Waiting for it to end, polling every %.0f s, for up "
                "to %.0f s (reattach_timeout); then the same run id runs again and resumes or returns its "
                "report",
                run_id,
                holder.describe(),
                POLL_S,
                timeout_s,
            )
        elif waited - said >= PROGRESS_EVERY_S:
            said = waited
            log.info("Still waiting for %s (%.0f s so far)", holder.describe(), waited)
        waited_for = holder
        if waited >= timeout_s:
            raise ReattachTimeoutError(
                f"The earlier attempt of replay run {run_id!r} still runs after {waited:.0f} s "
                f"(reattach_timeout {timeout_s:.0f} s): {holder.describe()}. The next try waits for it "
                "again; to stop it instead, end that process (or kill its Spark driver), then clear the task."
            )
        sleep(max(0.0, min(POLL_S, timeout_s - waited)))
    if waited_for is not None:
        log.info(
            "The earlier attempt of replay run %s ended after %.0f s of waiting; running the same run id "
            "again: it resumes where that attempt stopped, or returns its report",
            run_id,
            clock() - started,
        )
    return waited_for
