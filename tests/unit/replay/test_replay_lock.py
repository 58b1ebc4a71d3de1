"""The output directory lock: one run at a time, a killed run's lock taken over, never two owners."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import pytest

from pulsar_dlq_consumer.replay_lock import LOCK_PREFIX, lease_topic
from spark_apps.dlq_replay.errors import LockLostError, RunLockedError
from spark_apps.dlq_replay.lock import OutputLock, RunLock


def lock_files(root):
    return sorted(p.name for p in (root / "locks").iterdir())


def test_second_run_is_refused_naming_the_holder(tmp_path):
    first = OutputLock(str(tmp_path), "run-a")
    first.acquire()
    with pytest.raises(RunLockedError, match=r"another replay run holds the output directory .*run 'run-a'"):
        OutputLock(str(tmp_path), "run-b").acquire()
    # The same run id twice at once (an Airflow retry while the first try still runs) is refused too.
    with pytest.raises(RunLockedError):
        OutputLock(str(tmp_path), "run-a").acquire()
    data = json.loads((tmp_path / "locks" / f"{LOCK_PREFIX}1").read_text())
    assert {"run_id", "host", "pid", "acquired_at", "heartbeat_at", "expires_at", "ttl_s"} <= set(data)
    first.release()
    assert lock_files(tmp_path) == []
    second = OutputLock(str(tmp_path), "run-b")
    second.acquire()
    assert second.name == f"{LOCK_PREFIX}1"
    second.release()


def test_a_killed_owner_on_this_host_is_taken_over_at_once(tmp_path):
    holder = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {os.getcwd()!r})
        from spark_apps.dlq_replay.lock import OutputLock
        OutputLock({str(tmp_path)!r}, "killed-run").acquire()
        print("locked", flush=True)
        time.sleep(600)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(RunLockedError, match="killed-run"):
            OutputLock(str(tmp_path), "next-run").acquire()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    taker = OutputLock(str(tmp_path), "next-run")
    taker.acquire()
    assert taker.name == f"{LOCK_PREFIX}2"
    assert lock_files(tmp_path) == [f"{LOCK_PREFIX}2"]  # the stale generation is removed
    taker.release()


def test_an_expired_heartbeat_is_taken_over_and_the_old_owner_learns_it(tmp_path):
    old = OutputLock(str(tmp_path), "stalled-run", ttl_s=0.2)
    old.acquire()
    time.sleep(0.4)  # no heartbeat: the lock expires even though its process is alive
    new = OutputLock(str(tmp_path), "new-run")
    new.acquire()
    assert "taken over by run 'new-run'" in old.heartbeat()
    old.release()  # never deletes the new owner's lock
    assert lock_files(tmp_path) == [new.name]
    assert new.heartbeat() is None
    new.release()


def test_only_one_of_two_takers_wins_a_generation(tmp_path):
    (tmp_path / "locks").mkdir()
    (tmp_path / "locks" / f"{LOCK_PREFIX}4").write_text("{}")  # unreadable owner: stale
    a, b = OutputLock(str(tmp_path), "a"), OutputLock(str(tmp_path), "b")
    a.acquire()
    with pytest.raises(RunLockedError):
        b.acquire()
    assert a.name == f"{LOCK_PREFIX}5"
    a.release()


def test_run_lock_heartbeat_stops_the_run_when_the_lock_is_taken_over(tmp_path):
    run = RunLock(OutputLock(str(tmp_path), "slow", ttl_s=0.3), None, heartbeat_s=0.5)
    run.acquire()
    try:
        time.sleep(0.4)
        other = OutputLock(str(tmp_path), "other")
        other.acquire()
        deadline = time.monotonic() + 5
        while run.lost is None and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(LockLostError, match="taken over by run 'other'"):
            run.check()
        other.release()
    finally:
        run.release()


def test_lease_topics_are_per_topic_in_its_namespace():
    a = lease_topic("persistent://acme/ns/orders-DLQ")
    assert a.startswith("persistent://acme/ns/dlq-replay-lease-")
    assert a == lease_topic("acme/ns/orders-DLQ-partition-3")  # one partition shares its topic's lease
    assert a != lease_topic("persistent://acme/ns/payments-DLQ")
    assert lease_topic("orders-DLQ").startswith("persistent://public/default/dlq-replay-lease-")


class _LeaseClient:
    """A stand-in Pulsar client whose ``subscribe`` raises the given errors in turn, each after the
    request timeout on ``clock``, then succeeds."""

    def __init__(self, errors, clock):
        self.errors = list(errors)
        self.clock = clock
        self.calls = 0

    def subscribe(self, *args, **kwargs):
        from spark_apps.dlq_replay.lock import LEASE_TIMEOUT_S

        self.calls += 1
        self.last = (args, kwargs)
        if self.errors:
            self.clock[0] += LEASE_TIMEOUT_S  # an unanswered request takes its timeout
            raise self.errors.pop(0)
        return self

    def close(self):
        pass


def _lease(monkeypatch, errors, wait_s=60.0):
    from spark_apps.dlq_replay import lock
    from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf

    clock = [0.0]
    client = _LeaseClient(errors, clock)
    monkeypatch.setattr(lock, "create_client", lambda *a, **k: client)
    monkeypatch.setattr(lock.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(lock.time, "sleep", lambda seconds: clock.__setitem__(0, clock[0] + seconds))
    monkeypatch.setattr(lock, "LEASE_WAIT_S", wait_s)
    lease = lock.SubscriptionLease(PulsarConf(service_url="pulsar://127.0.0.1:1"), ("orders-DLQ",), "s", "r")
    return lease, client, clock


def test_a_lease_the_broker_does_not_answer_is_asked_again_until_it_does(monkeypatch):
    import pulsar

    lease, client, clock = _lease(monkeypatch, [pulsar.Timeout("t"), pulsar.ServiceUnitNotReady("n")])
    lease.acquire()
    assert client.calls == 3
    assert len(lease._consumers) == 1
    assert clock[0] == 2 * 10 + 1 + 2  # two timed-out requests, pauses of 1 s and 2 s
    lease.release()


def test_the_lease_is_per_dlq_topic_whatever_the_subscription(monkeypatch):
    from pulsar_dlq_consumer.replay_lock import LEASE_SUBSCRIPTION

    lease, client, _ = _lease(monkeypatch, [])
    lease.acquire()
    (topic, subscription), kwargs = client.last
    assert topic == lease_topic("orders-DLQ")
    assert subscription == LEASE_SUBSCRIPTION  # not the run's subscription "s": one run per DLQ topic
    assert kwargs["properties"]["run_id"] == "r"
    assert kwargs["properties"]["subscription"] == "s"
    lease.release()


def test_a_held_lease_is_refused_at_once(monkeypatch):
    import pulsar

    lease, client, _ = _lease(monkeypatch, [pulsar.ConsumerBusy("busy")])
    with pytest.raises(RunLockedError, match=r"another replay run is reading DLQ topic .*ConsumerBusy"):
        lease.acquire()
    assert client.calls == 1
    assert lease._consumers == []


def test_a_lease_never_answered_is_refused_naming_both_causes(monkeypatch):
    import pulsar

    lease, client, clock = _lease(monkeypatch, [pulsar.Timeout("t")] * 100)
    with pytest.raises(RunLockedError, match=r"did not grant .* within 60 s \(Timeout\): either another"):
        lease.acquire()
    assert 2 < client.calls < 10
    assert clock[0] <= 60


def test_a_lease_refused_for_good_is_a_usage_error(monkeypatch):
    import pulsar

    from spark_apps.dlq_replay.errors import ReplayConfigError

    lease, client, _ = _lease(monkeypatch, [pulsar.AuthorizationError("no")])
    with pytest.raises(ReplayConfigError, match="--subscription-lease off"):
        lease.acquire()
    assert client.calls == 1


def test_the_output_lock_keeps_beating_while_the_lease_is_awaited(tmp_path):
    class SlowLease:
        def acquire(self):
            time.sleep(1.2)  # longer than the lock's time to live: only the heartbeat keeps it

        def check(self):
            return None

        def release(self):
            pass

    run = RunLock(OutputLock(str(tmp_path), "waiting", ttl_s=0.6), SlowLease(), heartbeat_s=0.2)
    run.acquire()
    try:
        other = OutputLock(str(tmp_path), "other")
        with pytest.raises(RunLockedError, match="run 'waiting'"):
            other.acquire()
        run.check()
    finally:
        run.release()


class _InterruptingSession:
    """What the run lock uses of a SparkSession: interrupting its operations."""

    def __init__(self):
        self.interrupted = 0

    def interruptAll(self):
        self.interrupted += 1
        return ["op-1"]


def test_a_lost_lock_interrupts_the_runs_spark_operations(tmp_path):
    spark = _InterruptingSession()
    run = RunLock(OutputLock(str(tmp_path), "slow", ttl_s=0.3), None, spark, heartbeat_s=0.5)  # type: ignore[arg-type]
    run.acquire()
    try:
        time.sleep(0.4)
        other = OutputLock(str(tmp_path), "other")
        other.acquire()
        deadline = time.monotonic() + 5
        while not spark.interrupted and time.monotonic() < deadline:
            time.sleep(0.05)
        assert spark.interrupted == 1
        with pytest.raises(LockLostError):
            run.check()
        other.release()
    finally:
        run.release()


def test_lock_files_go_through_the_storage_layer(tmp_path, monkeypatch):
    from spark_apps.dlq_replay.storage import RunStorage

    calls: list[str] = []

    class Recording(RunStorage):
        def __getattribute__(self, name):
            if not name.startswith("_"):
                calls.append(name)
            return super().__getattribute__(name)

    lock = OutputLock(f"file://{tmp_path}", "run-a")
    lock.storage = Recording()
    lock.acquire()
    assert lock.heartbeat() is None
    lock.release()
    assert {"list_names", "read_text", "create_exclusive", "write_text", "delete"} <= set(calls)
    assert lock_files(tmp_path) == []


def test_an_object_store_root_needs_the_lease_and_holds_no_lock_file(monkeypatch, caplog):
    import logging

    from spark_apps.dlq_replay import lock
    from spark_apps.dlq_replay.errors import ReplayConfigError
    from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf

    with pytest.raises(ReplayConfigError, match=r"--subscription-lease off needs a local --output-dir"):
        lock.check_guard("s3://bucket/dlq", subscription_lease=False)
    lock.check_guard("s3://bucket/dlq", subscription_lease=True)
    lock.check_guard("relative/out", subscription_lease=False)  # local: the output lock guards it

    class Lease:
        acquired = released = False

        def __init__(self, *args):
            pass

        def acquire(self):
            Lease.acquired = True

        def check(self):
            return None

        def release(self):
            Lease.released = True

    monkeypatch.setattr(lock, "SubscriptionLease", Lease)
    conf = PulsarConf(service_url="pulsar://127.0.0.1:1")
    options = SimpleNamespace(
        run_id="run-a", topics=("orders-DLQ",), subscription="s", subscription_lease=True
    )
    with (
        caplog.at_level(logging.INFO, logger="spark_apps.dlq_replay"),
        lock.run_lock(None, "s3://bucket/dlq", options, conf) as held,
    ):
        assert held.output is None  # no exclusive create on an object store: the lease alone
        assert Lease.acquired
    assert Lease.released
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any("s3://bucket/dlq is not on a local file system" in m and "leases guard" in m for m in infos)
