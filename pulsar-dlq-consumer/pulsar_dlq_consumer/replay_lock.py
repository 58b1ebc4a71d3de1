"""Who holds a replay run: the output lock record and lease names the app takes and the operator reads."""

from __future__ import annotations

import hashlib
import json
import os
import socket
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from pulsar_dlq_consumer.context import base_topic
from pulsar_dlq_consumer.topics import normalize_topic

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

#: The output directory lock's files: ``<output>/locks/replay.lock.<generation>``.
LOCK_PREFIX = "replay.lock."
LOCK_FORMAT = 1
#: The Exclusive subscription each run holds on the lease topic of every DLQ topic it reads.
LEASE_SUBSCRIPTION = "dlq-replay-lease"


def lease_topic(dlq_topic: str) -> str:
    """The lease topic of a DLQ topic: same tenant and namespace, named by a hash of the full name (of
    the partitioned topic, so runs naming one partition and the whole topic share one lease)."""
    full = base_topic(normalize_topic(dlq_topic))
    namespace = full.rsplit("/", 1)[0]
    digest = hashlib.sha256(full.encode("utf-8")).hexdigest()[:16]
    return f"{namespace}/dlq-replay-lease-{digest}"


def run_hash(run_id: str) -> str:
    """The short hash of a run id that names the run's producers and lease consumers."""
    return hashlib.sha256(run_id.encode("utf-8")).hexdigest()[:12]


def lock_generation(name: str) -> int | None:
    """The generation of an output lock file's name, ``None`` for any other file."""
    tail = name[len(LOCK_PREFIX) :] if name.startswith(LOCK_PREFIX) else ""
    return int(tail) if tail.isdigit() else None


def process_start(pid: int) -> str | None:
    """The start time of ``pid`` (Linux ``/proc/<pid>/stat`` field 22), to tell a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def pid_alive(pid: int, start: str | None) -> bool:
    """True while process ``pid`` of this host runs and is the one started at ``start``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return start is None or process_start(pid) in (None, start)


def utc_iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class LockOwner:
    """Who holds an output lock, as written in the lock file."""

    run_id: str
    host: str
    pid: int
    pid_start: str | None
    acquired_at: float
    heartbeat_at: float
    ttl_s: float

    def to_json(self) -> str:
        expires = utc_iso(self.heartbeat_at + self.ttl_s)
        return json.dumps({"format": LOCK_FORMAT, **asdict(self), "expires_at": expires}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> LockOwner | None:
        """The owner a lock file names; ``None`` for a half-written or foreign file."""
        try:
            data = json.loads(text)
            return cls(**{name: data[name] for name in cls.__dataclass_fields__})
        except (ValueError, KeyError, TypeError):
            return None

    def stale_reason(self, now: float, alive: Callable[[int, str | None], bool] = pid_alive) -> str | None:
        """Why this lock no longer holds (``None`` while it does), seen from this host."""
        if now > self.heartbeat_at + self.ttl_s:
            return f"its last heartbeat was {now - self.heartbeat_at:.0f} s ago (expiry {self.ttl_s:g} s)"
        if self.host == socket.gethostname() and not alive(self.pid, self.pid_start):
            return f"its process {self.pid} on this host is gone"
        return None

    def describe(self) -> str:
        expires = utc_iso(self.heartbeat_at + self.ttl_s)
        return (
            f"run {self.run_id!r} (host {self.host}, pid {self.pid}, since {utc_iso(self.acquired_at)}, "
            f"last heartbeat {utc_iso(self.heartbeat_at)}, valid until {expires})"
        )


def lease_holder(properties: Mapping[str, str], shown: Callable[[object], str] = repr) -> str | None:
    """The run a lease consumer's ``properties`` name, else ``None`` (``shown`` quotes what may be secret)."""
    if not properties.get("run_id"):
        return None
    return (
        f"run {shown(properties['run_id'])} (subscription {shown(properties.get('subscription'))}, host "
        f"{properties.get('host')}, pid {properties.get('pid')}, since {properties.get('since')})"
    )
