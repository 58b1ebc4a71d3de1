"""The next try's decision: who holds the run (the output lock, a lease), wait for an earlier attempt of the
same run id, fail at once for a different run, and the standalone cluster driver's reattach by its id."""

from __future__ import annotations

import json
import logging
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_dlq.operators.reattach import (
    OtherRunHoldsError,
    ReattachTimeoutError,
    RunHolder,
    lease_holder,
    lease_topic,
    output_lock_holder,
    wait_for_earlier_attempt,
)
from airflow_provider_dlq.operators.replay import DlqReplayOperator
from airflow_provider_dlq.operators.replay_cli import ReplayArgumentError
from airflow_provider_dlq.operators.spark_submit import DRIVER_ID_KEY

LOG = logging.getLogger("test.reattach")


def write_lock(root: Path, generation: int, **fields: Any) -> None:
    now = time.time()
    data = {
        "format": 1, "run_id": "r1", "host": socket.gethostname(), "pid": 4242, "pid_start": "77",
        "acquired_at": now, "heartbeat_at": now, "ttl_s": 60.0, **fields,
    }  # fmt: skip
    (root / "locks").mkdir(parents=True, exist_ok=True)
    (root / "locks" / f"replay.lock.{generation}").write_text(json.dumps(data))


# ----------------------------------------------------------------------------- who holds the run


def test_no_lock_directory_means_nothing_holds_the_run(tmp_path: Path) -> None:
    assert output_lock_holder(str(tmp_path / "out")) is None


def test_a_live_lock_of_this_host_names_its_run(tmp_path: Path) -> None:
    write_lock(tmp_path, 1, run_id="old")
    write_lock(tmp_path, 2, run_id="r1")
    holder = output_lock_holder(str(tmp_path), alive=lambda pid, start: (pid, start) == (4242, "77"))
    assert holder is not None
    assert holder.run_id == "r1"
    assert holder.who.startswith(f"run 'r1' (host {socket.gethostname()}, pid 4242, since ")
    assert holder.where == f"the output directory lock of {tmp_path}"


def test_a_lock_whose_process_is_gone_or_whose_heartbeat_expired_is_stale(tmp_path: Path) -> None:
    write_lock(tmp_path, 1)
    assert output_lock_holder(str(tmp_path), alive=lambda pid, start: False) is None
    write_lock(tmp_path, 1, host="elsewhere", heartbeat_at=time.time() - 61)
    assert output_lock_holder(str(tmp_path), alive=lambda pid, start: True) is None


def test_another_hosts_lock_holds_while_its_heartbeat_is_fresh(tmp_path: Path) -> None:
    write_lock(tmp_path, 3, host="spark-worker-2")  # a cluster driver: its pid cannot be checked here
    holder = output_lock_holder(f"file://{tmp_path}", alive=lambda pid, start: False)
    assert holder is not None
    assert "(host spark-worker-2, pid 4242" in holder.who


def test_a_half_written_lock_or_an_object_store_root_is_no_holder(tmp_path: Path) -> None:
    (tmp_path / "locks").mkdir()
    (tmp_path / "locks" / "replay.lock.1").write_text("{")
    assert output_lock_holder(str(tmp_path)) is None
    assert output_lock_holder("s3a://bucket/dlq") is None


def test_lease_topic_matches_the_apps_naming() -> None:
    import hashlib

    full = "persistent://public/default/orders-sub-DLQ"
    want = f"persistent://public/default/dlq-replay-lease-{hashlib.sha256(full.encode()).hexdigest()[:16]}"
    assert lease_topic("orders-sub-DLQ") == want
    assert lease_topic("public/default/orders-sub-DLQ") == want
    assert lease_topic(f"{full}-partition-3") == want


def test_the_lease_consumers_properties_name_the_holder() -> None:
    asked: list[tuple[str, str]] = []

    def consumers(topic: str, subscription: str) -> list[dict[str, str]]:
        asked.append((topic, subscription))
        meta = {"run_id": "r9", "subscription": "s", "host": "w1", "pid": "12", "since": "t"}
        return [meta] if len(asked) == 2 else []

    holder = lease_holder(["a-DLQ", "b-DLQ"], consumers)
    who = "run 'r9' (subscription 's', host w1, pid 12, since t)"
    assert holder == RunHolder("r9", who, "the lease on DLQ topic b-DLQ")
    assert [s for _, s in asked] == ["dlq-replay-lease", "dlq-replay-lease"]


# ----------------------------------------------------------------------------- the wait


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_nothing_holding_the_run_runs_it_at_once() -> None:
    clock = Clock()
    got = wait_for_earlier_attempt("r1", lambda: None, 600, LOG, sleep=clock.sleep, clock=clock)
    assert got is None
    assert clock.sleeps == []


def test_an_earlier_attempt_of_the_same_run_is_polled_until_it_ends(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    earlier = RunHolder("r1", "run 'r1' (host h, pid 7)", "the output directory lock of /o")
    answers = [earlier, earlier, earlier, None]
    with caplog.at_level(logging.INFO):
        got = wait_for_earlier_attempt("r1", lambda: answers.pop(0), 600, LOG, clock.sleep, clock)
    assert got == earlier
    assert clock.sleeps == [5.0, 5.0, 5.0]  # polls, never a busy loop
    assert "An earlier attempt of replay run r1 is still running: run 'r1' (host h, pid 7)" in caplog.text
    assert "ended after 15 s of waiting; running the same run id again" in caplog.text


def test_a_different_run_fails_at_once_without_waiting() -> None:
    clock = Clock()
    other = RunHolder("nightly-2", "run 'nightly-2' (host h, pid 8)", "the lease on DLQ topic d")
    with pytest.raises(OtherRunHoldsError, match=r"run 'nightly-2'.*does not wait for a different run"):
        wait_for_earlier_attempt("r1", lambda: other, 600, LOG, sleep=clock.sleep, clock=clock)
    assert clock.sleeps == []


def test_the_wait_is_bounded_by_the_timeout() -> None:
    clock = Clock()
    earlier = RunHolder("r1", "run 'r1' (host h, pid 7)", "the lock")
    with pytest.raises(ReattachTimeoutError, match="still runs after 12 s"):
        wait_for_earlier_attempt("r1", lambda: earlier, 12, LOG, clock.sleep, clock)
    assert clock.sleeps == [5.0, 5.0, 2.0]
    with pytest.raises(ReattachTimeoutError):  # 0: no wait at all
        wait_for_earlier_attempt("r1", lambda: earlier, 0, LOG, clock.sleep, clock)


def test_reattach_timeout_is_checked() -> None:
    from datetime import timedelta

    op = DlqReplayOperator(task_id="t", topics="d", output_dir="/o", reattach_timeout=timedelta(minutes=2))
    assert op.reattach_timeout == 120.0
    with pytest.raises(ReplayArgumentError, match="reattach_timeout"):
        DlqReplayOperator(task_id="t2", topics="d", output_dir="/o", reattach_timeout=-1)


# ----------------------------------------------------------------------------- standalone cluster driver


class Store:
    def __init__(self, **values: Any) -> None:
        self.values = dict(values)

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def set(self, key: str, value: Any) -> None:
        self.values[key] = value


class Hook:
    tracks_driver = True

    def __init__(self, state: str | None) -> None:
        self.state = state
        self.reattached: list[str] = []

    def driver_state(self, driver_id: str) -> str | None:
        return self.state

    def reattach(self, driver_id: str) -> None:
        self.reattached.append(driver_id)


@pytest.mark.parametrize(
    ("state", "done", "reattached"),
    [("RUNNING", True, ["driver-1"]), ("SUBMITTED", True, ["driver-1"]), ("UNKNOWN", True, ["driver-1"]),
     ("FINISHED", True, []), ("FAILED", False, []), ("KILLED", False, []), (None, False, [])],
)  # fmt: skip
def test_a_stored_driver_is_reattached_while_it_runs(
    state: str | None, done: bool, reattached: list[str]
) -> None:
    op = DlqReplayOperator(task_id="t", topics="d", output_dir="/o")
    hook = Hook(state)
    assert op.reattach_driver(hook, Store(**{DRIVER_ID_KEY: "driver-1"})) is done  # type: ignore[arg-type]
    assert hook.reattached == reattached


def test_no_stored_driver_submits_and_the_driver_id_is_kept() -> None:
    op = DlqReplayOperator(task_id="t", topics="d", output_dir="/o")
    store = Store()
    assert op.reattach_driver(Hook("RUNNING"), store) is False  # type: ignore[arg-type]
    op._keep_driver_id(store, "driver-20240501-0001")
    assert store.values == {DRIVER_ID_KEY: "driver-20240501-0001"}


def test_the_store_is_used_only_for_a_durable_standalone_cluster_run() -> None:
    store = Store()
    op = DlqReplayOperator(task_id="t", topics="d", output_dir="/o")
    assert op.driver_store(Hook("RUNNING"), {"task_state_store": store}) is store  # type: ignore[arg-type]
    client = Hook("RUNNING")
    client.tracks_driver = False
    assert op.driver_store(client, {"task_state_store": store}) is None  # type: ignore[arg-type]
    assert op.driver_store(Hook("RUNNING"), {}) is None  # type: ignore[arg-type]
    off = DlqReplayOperator(task_id="t2", topics="d", output_dir="/o", durable=False)
    assert off.driver_store(Hook("RUNNING"), {"task_state_store": store}) is None  # type: ignore[arg-type]
