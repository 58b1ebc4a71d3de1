"""Fault suite, broker: Apache Pulsar SIGKILLed while the replay is in snapshot, apply and commit, and
restarted on the same ports and data (the same cluster, as after a crash and a supervisor's restart).

The replay (reader mode: ``--admin-url``) either rides through the restart or fails cleanly with exit
code 1 and is resumed with the same command; either way the totals are exact, nothing is lost, nothing
reaches the origin twice (broker deduplication is on) and exactly the skipped messages stay pending.

The module has a broker of its own: the session broker is never killed (other tests use it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fault_support import (
    CASES,
    FaultRow,
    app_output,
    check_exact_run,
    finish,
    signal_tree,
    start,
    state_of,
    step_status,
    tree,
    wait_for_step,
)
from test_fault_kills import PLAYBOOK, build_dlqs
from test_fault_mid_wave import build_dlqs as build_large_dlqs
from test_fault_mid_wave import received_on

from pulsar_standalone.admin import AdminClient

pytestmark = [pytest.mark.integration, pytest.mark.real_pulsar, pytest.mark.slow]

WAVE, PRODUCERS = 40, 2


@pytest.fixture(scope="module")
def broker() -> Iterator[Any]:
    """Apache Pulsar standalone for this module only (own ports and temp data dir, removed at the end)."""
    from pulsar_standalone import start_standalone

    broker = start_standalone()  # retries on new ports when a picked port was taken before the bind
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def client(broker: Any) -> Iterator[Any]:
    import pulsar

    client = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
    try:
        yield client
    finally:
        client.close()


def args(broker: Any, dlqs: list[str], out: Path, run_id: str, *extra: str) -> list[str]:
    return [
        "--run-id", run_id, "--mode", "replay", "--service-url", broker.service_url,
        "--admin-url", broker.admin_url, "--topics", ",".join(dlqs), "--output-dir", str(out),
        "--playbook", PLAYBOOK, "--origin-allowlist", "orders-*", "--idle-timeout-ms", "1500",
        "--parallelism", str(PRODUCERS), *extra,
    ]  # fmt: skip


def kill_broker_in_step(
    proc: Any, broker: Any, out: Path, run_id: str, step: str, ready: Any = None, timeout: float = 600
) -> str:
    """SIGKILL the broker while ``step`` runs; returns the step's status at that moment.

    The app is frozen (SIGSTOP) while its state is read and the broker is killed, then let go: the kill
    lands inside the step, never in a gap the poll missed.
    """
    wait_for_step(proc, out, run_id, step, ready, timeout)
    procs = tree(proc)
    signal_tree(procs, signal.SIGSTOP)
    try:
        status = step_status(out, run_id, step) or "missing"
        broker.kill()
    finally:
        signal_tree(procs, signal.SIGCONT)
    return status


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("step", CASES["broker"])
def test_broker_killed_and_restarted_in_a_step(step, broker, client, fault_bundle, fault_table, tmp_path):
    out = tmp_path / "out"
    run_id = f"broker-{step}"
    in_flight: Callable[[dict[str, Any]], bool] | None = None
    if step == "apply":  # 20,000 messages, waves of many batches; the kill lands inside the second wave
        origins, dlqs, expected = build_large_dlqs(client)
        admin = AdminClient(broker.admin_url)
        argv = args(broker, dlqs, out, run_id, "--wave-size", "2000", "--rate-limit", "4000")

        def in_wave_two(p: dict[str, Any]) -> bool:
            sending = p.get("waves_done", 0) >= 1 and "wave_in_flight" in p
            return sending and received_on(admin, origins) > 11_000

        in_flight = in_wave_two
    else:
        origin, dlqs, expected = build_dlqs(client)
        origins = [origin]
        argv = args(broker, dlqs, out, run_id, "--wave-size", str(WAVE))
    first = start(fault_bundle, argv, tmp_path, "first")
    try:
        status = kill_broker_in_step(first, broker, out, run_id, step, in_flight)
        broker.restart()
    except BaseException:
        with contextlib.suppress(Exception):
            first.kill()
        raise
    assert status == "running", f"the broker died after step {step} ended ({status}); nothing was tested"

    code = first.wait(timeout=900)
    first_err = app_output(tmp_path, "first")
    if code == 0:
        how = "rode through the restart (exit 0)"
        summary = finish(first, tmp_path, "first")
    else:
        # A clean failure: the resumable exit code, the resume hint, and the step left to redo.
        assert code == 1, f"the run exited {code} (expected 0 or 1):\n{first_err[-4000:]}"
        assert "re-run the same --run-id to resume" in first_err, first_err[-4000:]
        failed_in = next(
            (s for s, v in state_of(out, run_id).get("steps", {}).items() if v.get("status") != "complete"),
            "?",
        )
        how = f"exit 1 in `{failed_in}`, resumed with the same command: exit 0"
        resume = start(fault_bundle, argv, tmp_path, "resume")
        summary = finish(resume, tmp_path, "resume")

    totals = summary["totals"]
    state = check_exact_run(summary, out, client, origins, dlqs, expected)
    fault_table.record(
        FaultRow(
            category="broker",
            case=step,
            fault=f"Apache Pulsar SIGKILLed during `{step}` (reader mode), restarted on the same ports and "
            "data",
            expected="rides through, or exits 1 and resumes; exact totals; nothing doubled (broker dedup); "
            "skipped ones pending",
            result=f"{how}: {len(expected)} messages, republished {totals['republished']}, archived "
            f"{totals['archived']}, acked {totals['acked']}, resent {totals['resent']}",
            lost=state.lost,
            doubled=state.doubled,
            pending=state.pending,
        )
    )


@pytest.mark.timeout(300)
def test_a_lease_asked_of_a_broker_that_does_not_answer_is_granted_once_it_does(broker):
    """The broker frozen (SIGSTOP) for longer than one lease request, as while it restarts after a crash:
    the run keeps asking and gets its lease; it is not refused as if another run held it. A held lease
    is still refused at once."""
    from spark_apps.dlq_replay.errors import RunLockedError
    from spark_apps.dlq_replay.lock import LEASE_TIMEOUT_S, LEASE_WAIT_S, SubscriptionLease
    from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf

    conf = PulsarConf(service_url=broker.service_url)
    dlq = f"persistent://public/default/orders-{uuid.uuid4().hex[:8]}-sub-DLQ"
    lease = SubscriptionLease(conf, (dlq,), "dlq-replayer", "paused-broker")
    failed: list[BaseException] = []

    def take() -> None:
        try:
            lease.acquire()
        except BaseException as exc:
            failed.append(exc)

    # The broker's JVM unpacks its natives into its own temp dir, removed with it (see broker.stop).
    assert any(broker.tmp_dir.glob("librocksdbjni*")), sorted(broker.tmp_dir.iterdir())
    taker = threading.Thread(target=take)
    os.kill(broker.pid, signal.SIGSTOP)
    try:
        taker.start()
        time.sleep(LEASE_TIMEOUT_S + 5)  # the first request times out unanswered
    finally:
        os.kill(broker.pid, signal.SIGCONT)
    taker.join(LEASE_WAIT_S + 30)
    try:
        assert not taker.is_alive()
        assert not failed, failed
        ((_, consumer),) = lease._consumers
        assert consumer.is_connected()
        other = SubscriptionLease(conf, (dlq,), "dlq-replayer", "other-run")
        began = time.monotonic()
        with pytest.raises(RunLockedError, match="ConsumerBusy"):
            other.acquire()
        assert time.monotonic() - began < LEASE_TIMEOUT_S
    finally:
        lease.release()
