"""One replay at a time (``docs/reliability.md``): two runs at once would republish the same messages twice.
A run holds the output directory lock and a lease per DLQ topic; losing either interrupts its Spark jobs."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pulsar_dlq_consumer.client import create_client
from pulsar_dlq_consumer.replay_lock import (
    LEASE_SUBSCRIPTION,
    LOCK_PREFIX,
    LockOwner,
    lease_holder,
    lease_topic,
    lock_generation,
    process_start,
    run_hash,
    utc_iso,
)
from spark_apps.dlq_replay.errors import LockLostError, ReplayConfigError, RunLockedError
from spark_apps.dlq_replay.pulsar_io.admin import PulsarAdmin
from spark_apps.dlq_replay.pulsar_io.conf import client_auth_kwargs, client_logger
from spark_apps.dlq_replay.redaction import shown
from spark_apps.dlq_replay.storage import RunStorage, is_local, join, qualify_root

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pyspark.sql import SparkSession

    from spark_apps.dlq_replay.options import ReplayOptions
    from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf

log = logging.getLogger("spark_apps.dlq_replay")

#: Seconds between heartbeats, and how long after its last heartbeat a lock is still valid.
HEARTBEAT_S = 10.0
LOCK_TTL_S = 60.0
#: How long one request for a lease may take (pulsar-lite answers a busy one only by timing out).
LEASE_TIMEOUT_S = 10
#: How long to ask again for a lease the broker does not answer (Apache Pulsar refuses a held one at once).
LEASE_WAIT_S = 60.0
#: A lease that stays disconnected this long is treated as lost.
LEASE_GRACE_S = 30.0


def check_guard(output_root: str, subscription_lease: bool) -> None:
    """Refuse ``--subscription-lease off`` where no output lock can be held (not a local file system)."""
    if subscription_lease or is_local(qualify_root(output_root)):
        return
    raise ReplayConfigError(
        f"--subscription-lease off needs a local --output-dir, got {output_root}: an object store offers "
        "no exclusive create, so no output directory lock can keep a second run out there, and two runs "
        "at once would republish the same messages twice. Keep --subscription-lease on (the default), "
        "which guards the run at the broker, or give a local --output-dir"
    )


class OutputLock:
    """``<output>/locks/replay.lock.<generation>`` (``O_EXCL``: local roots), valid :data:`LOCK_TTL_S` after
    its last heartbeat; a stale one is taken over by creating the next generation."""

    def __init__(self, output_root: str, run_id: str, ttl_s: float = LOCK_TTL_S) -> None:
        self.output_root = output_root
        self.directory = join(output_root, "locks")
        self.storage = RunStorage()
        self.run_id = run_id
        self.ttl_s = ttl_s
        self.owner: LockOwner | None = None
        self.name: str | None = None

    def _current(self) -> tuple[int, LockOwner | None]:
        names = self.storage.list_names(self.directory)
        latest = max((g for g in map(lock_generation, names) if g is not None), default=0)
        text = self.storage.read_text(join(self.directory, f"{LOCK_PREFIX}{latest}"))  # None: no lock yet
        return latest, LockOwner.from_json(text) if text else None

    def acquire(self) -> None:
        """Take the lock, or raise :class:`RunLockedError` naming the run that holds it."""
        generation, holder = self._current()
        if holder is not None:
            stale = holder.stale_reason(time.time())
            if stale is None:
                raise RunLockedError(
                    f"another replay run holds the output directory {self.output_root}: {holder.describe()}. "
                    "Wait for it to finish (a killed run's lock expires by itself), or use another "
                    "--output-dir; two runs at once would republish the same messages twice"
                )
            log.warning("taking over the output lock of %s: %s", holder.describe(), stale)
        now, pid = time.time(), os.getpid()
        owner = LockOwner(self.run_id, socket.gethostname(), pid, process_start(pid), now, now, self.ttl_s)
        name = f"{LOCK_PREFIX}{generation + 1}"
        if not self.storage.create_exclusive(join(self.directory, name), owner.to_json()):
            _, winner = self._current()
            raise RunLockedError(
                f"another replay run took the output directory {self.output_root} at the same moment"
                + (f": {winner.describe()}" if winner else "")
                + "; wait for it to finish or use another --output-dir"
            )
        self.owner, self.name = owner, name
        for old in self.storage.list_names(self.directory):
            if (gen := lock_generation(old)) is not None and gen <= generation:
                self.storage.delete(join(self.directory, old))

    def heartbeat(self) -> str | None:
        """Refresh the heartbeat; returns why the lock is lost, or ``None`` while it is held."""
        if self.owner is None or self.name is None:
            return "the lock is not held"
        generation, holder = self._current()
        if holder is None or f"{LOCK_PREFIX}{generation}" != self.name:
            who = holder.describe() if holder else "another run"
            return f"the output directory lock was taken over by {who}"
        self.owner = replace(self.owner, heartbeat_at=time.time())
        self.storage.write_text(join(self.directory, self.name), self.owner.to_json())  # atomic: a rename
        return None

    def release(self) -> None:
        if self.name is None:
            return
        generation, holder = self._current()
        if f"{LOCK_PREFIX}{generation}" == self.name and holder is not None and holder.pid == os.getpid():
            self.storage.delete(join(self.directory, self.name))
        self.name = self.owner = None


@dataclass(eq=False, repr=False)  # no repr: the conf holds credentials
class SubscriptionLease:
    """Exclusive consumers on the (message-less) lease topics of the run's DLQ topics."""

    conf: PulsarConf
    topics: tuple[str, ...]
    subscription: str
    run_id: str
    _client: Any = field(default=None, init=False)
    _consumers: list[tuple[str, Any]] = field(default_factory=list, init=False)
    _down_since: dict[str, float] = field(default_factory=dict, init=False)
    _properties: dict[str, str] = field(default_factory=dict, init=False)

    def acquire(self) -> None:
        import pulsar

        self._client = create_client(
            self.conf.service_url,
            logger=client_logger(),
            **client_auth_kwargs(self.conf, operation_timeout_seconds=LEASE_TIMEOUT_S),
        )
        name = f"dlq-replay-lease-{run_hash(self.run_id)}-{os.getpid()}"
        self._properties = {
            "run_id": self.run_id,
            "subscription": self.subscription,
            "host": socket.gethostname(),
            "pid": str(os.getpid()),
            "since": utc_iso(time.time()),
        }
        deadline = time.monotonic() + LEASE_WAIT_S
        try:
            for topic in dict.fromkeys(self.topics):
                lease = lease_topic(topic)
                self._consumers.append((lease, self._subscribe(pulsar, topic, lease, name, deadline)))
        except BaseException:
            self.release()
            raise

    def _subscribe(self, pulsar: Any, topic: str, lease: str, name: str, deadline: float) -> Any:
        """The Exclusive lease consumer on ``lease``, asking again while the broker does not answer."""
        unanswered = (
            pulsar.Timeout,
            pulsar.ServiceUnitNotReady,
            pulsar.TooManyLookupRequestException,
            pulsar.ConnectError,
            pulsar.NotConnected,
        )
        pause = 1.0
        while True:
            try:
                return self._client.subscribe(
                    lease,
                    LEASE_SUBSCRIPTION,
                    consumer_type=pulsar.ConsumerType.Exclusive,
                    receiver_queue_size=1,
                    consumer_name=name,
                    properties=self._properties,
                )
            except pulsar.ConsumerBusy as exc:
                raise RunLockedError(
                    f"another replay run is reading DLQ topic {topic}: {self._holder(lease)} holds its lease "
                    f"on {lease} (the broker refused this run's, ConsumerBusy). Wait for that run to "
                    "finish; two runs at once on one DLQ, through the same or different --subscription "
                    "names, would republish the same messages twice"
                ) from exc
            except pulsar.AuthorizationError as exc:
                raise ReplayConfigError(
                    f"this run's role may not consume the lease topic {lease} of DLQ topic {topic} "
                    "(AuthorizationError). Create topic "
                    f"{lease} if the broker does not create topics itself (pulsar-admin topics create "
                    f"{lease}), then grant the role consume on it (pulsar-admin topics grant-permission "
                    f"--role <role> --actions consume {lease}); or pass --subscription-lease off"
                ) from exc
            except unanswered as exc:
                left = deadline - time.monotonic()
                if left < pause + LEASE_TIMEOUT_S:
                    raise RunLockedError(
                        f"the broker did not grant this run's lease on {lease} for DLQ topic {topic} "
                        f"within {LEASE_WAIT_S:.0f} s "
                        f"({type(exc).__name__}): either another replay run holds it (pulsar-lite answers "
                        "a held lease only by timing out) or the broker is not serving that topic yet "
                        "(restarting, overloaded). Wait for the other run to finish or the broker to "
                        "recover, then re-run; two runs at once would republish the same messages twice"
                    ) from exc
                log.warning(
                    "the broker did not answer for the lease on %s (%s); asking again for up to %.0f s",
                    lease,
                    type(exc).__name__,
                    left,
                )
                time.sleep(pause)
                pause = min(pause * 2, 5.0)
            except pulsar.PulsarException as exc:
                raise ReplayConfigError(
                    f"cannot take the subscription lease on {lease} for DLQ topic {topic} "
                    f"({type(exc).__name__}: {exc}): check the run's credentials (token, OAuth2 or TLS), "
                    f"create topic {lease} if the broker does not create topics itself (pulsar-admin topics "
                    f"create {lease}) and let the replayer consume it, or pass --subscription-lease off to "
                    "rely on the output directory lock alone"
                ) from exc

    def _holder(self, lease: str) -> str:
        """The run holding ``lease``, from its consumer's properties in the admin REST ``stats``."""
        if not self.conf.admin_url:
            return "another run (give --admin-url to see which)"
        try:
            stats = PulsarAdmin(self.conf, timeout_s=5.0).stats(lease)
            consumers = stats["subscriptions"][LEASE_SUBSCRIPTION]["consumers"]
            meta = dict(consumers[0].get("metadata") or {})
        except Exception as exc:  # naming the holder is a courtesy: the refusal stands without it
            log.info("could not read the lease holder from %s: %s", lease, type(exc).__name__)
            return "another run"
        return lease_holder(meta, shown) or "another run"

    def check(self) -> str | None:
        """Why the lease is lost (disconnected longer than :data:`LEASE_GRACE_S`), else ``None``."""
        now = time.time()
        for lease, consumer in tuple(self._consumers):
            if consumer.is_connected():
                self._down_since.pop(lease, None)
                continue
            since = self._down_since.setdefault(lease, now)
            if now - since > LEASE_GRACE_S:
                return f"the subscription lease on {lease} has been disconnected for {now - since:.0f} s"
        return None

    def release(self) -> None:
        closing = [consumer for _, consumer in self._consumers]
        closing += [self._client] if self._client is not None else []
        self._consumers, self._client = [], None
        for each in closing:  # the consumers, then the client
            with contextlib.suppress(Exception):
                each.close()


@dataclass(eq=False, repr=False)  # no repr: the conf holds credentials
class RunLock:
    """The output lock and the subscription leases of one run (either may be absent), with their heartbeat."""

    output: OutputLock | None
    lease: SubscriptionLease | None
    spark: SparkSession | None = None
    heartbeat_s: float = HEARTBEAT_S
    lost: str | None = field(default=None, init=False)  # why the lock was lost
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)

    def acquire(self) -> None:
        if self.output is not None:
            self.output.acquire()
        # The heartbeat runs from here: taking the leases may wait for the broker (LEASE_WAIT_S), and the
        # output lock must not expire meanwhile.
        self._thread = threading.Thread(target=self._beat, name="dlq-replay-lock-heartbeat", daemon=True)
        self._thread.start()
        try:
            if self.lease is not None:
                self.lease.acquire()
            self.check()
        except BaseException:
            self.release()
            raise

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                reason = (self.output.heartbeat() if self.output is not None else None) or (
                    self.lease.check() if self.lease is not None else None
                )
            except Exception as exc:  # a failed heartbeat write: the lock may expire, say so
                log.warning("lock heartbeat failed: %s: %s", type(exc).__name__, exc)
                continue
            if reason is not None:
                self.lost = reason
                log.error("run lock lost: %s; interrupting this run's Spark jobs", reason)
                self.interrupt()
                return

    def interrupt(self) -> None:
        """Interrupt all the session's operations (not by tag: a classic session's tags are per thread)."""
        if self.spark is None:
            return
        try:
            stopped = self.spark.interruptAll()
        except Exception as exc:  # the session is gone: nothing runs any more
            log.warning("could not interrupt the run's Spark jobs: %s: %s", type(exc).__name__, exc)
            return
        log.info("interrupted %d Spark operation(s) of this run", len(stopped))

    def check(self) -> None:
        """Raise :class:`LockLostError` when the lock or a lease was lost."""
        if self.lost is not None:
            raise LockLostError(
                f"{self.lost}; this run stopped so that two runs never interleave. Re-run the same "
                "--run-id to resume once the other run has finished"
            )

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.heartbeat_s + 5)
        if self.lease is not None:
            self.lease.release()
        if self.output is not None:
            self.output.release()


@contextlib.contextmanager
def run_lock(
    spark: SparkSession | None, root: str, options: ReplayOptions, conf: PulsarConf
) -> Iterator[RunLock]:
    """Hold the output lock on ``root`` (where possible) and the leases of the run's topics (unless off)."""
    local = is_local(qualify_root(root))
    if not local:
        log.info(
            "output dir %s is not on a local file system: no output lock file there (an object store "
            "offers no exclusive create); the subscription leases guard this run",
            root,
        )
    lease = SubscriptionLease(conf, options.topics, options.subscription, options.run_id)
    output = OutputLock(root, options.run_id) if local else None
    lock = RunLock(output, lease if options.subscription_lease else None, spark)
    lock.acquire()
    try:
        yield lock
    finally:
        lock.release()
