"""Fault suite, kills inside a wave: the spark-submit tree SIGKILLed again and again while apply is sending
(tens of thousands of messages, waves of many batches), then resumed to the end. With broker
deduplication nothing is lost and nothing doubled; without it, the copies on the origin stay within what
the report counts as ``resent`` and its bound (wave size x producers).

The kills land when the broker has received a rising number of the run's republished messages (its own
``msgInCounter`` of the origin topics, which also counts the re-sent copies it drops), so each attempt
dies at another place inside a wave: while re-sending batches the broker already holds, or while sending
new ones. The origins are counted with consumers that read everything (nothing acked).
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from fault_support import FaultRow, dlq_properties, end_state, finish, signal_tree, start, state_of, tree

from pulsar_standalone.admin import AdminClient

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
PLAYBOOK = str(REPO / "examples" / "playbooks" / "orders.yaml")
ORIGINS, REPLAY, ARCHIVE = 4, 4_000, 1_000  # 20,000 DLQ messages, 16,000 republished
PARALLELISM = 2
#: Messages a second in all: about 4 s of sending a full attempt, and 2 s a wave of 500 ids per producer,
#: so the kills land while a wave is being sent rather than while its results are saved.
RATES = {None: "4000", "500": "1000"}
KILLS = 3


def build_dlqs(client: Any) -> tuple[list[str], list[str], dict[str, str]]:
    """One DLQ per origin topic, each with ``REPLAY`` messages to republish and ``ARCHIVE`` to archive."""
    u = uuid.uuid4().hex[:8]
    origins = [f"persistent://public/default/orders-{u}-{o}" for o in range(ORIGINS)]
    dlqs = [f"{origin}-billing-DLQ" for origin in origins]
    for origin in origins:  # a subscription first: Apache Pulsar keeps messages only for subscriptions
        client.subscribe(origin, "verify").close()
    expected: dict[str, str] = {}
    n = 0
    for o, (origin, dlq) in enumerate(zip(origins, dlqs, strict=True)):
        producer = client.create_producer(dlq, batching_max_messages=500, block_if_queue_full=True)
        for kind, count, cls, outcome in (
            ("t", REPLAY, "TimeoutError", "republished"),
            ("a", ARCHIVE, "json.decoder.JSONDecodeError", "archived"),
        ):
            for i in range(count):
                key = f"{kind}-{o}-{i}"
                props = dlq_properties(origin, cls, "inventory timed out after 30s", n)
                producer.send_async(
                    b'{"order_id": "ORD-1", "amount": 1}', None, properties=props, partition_key=key
                )
                expected[key] = outcome
                n += 1
        producer.flush()
        producer.close()
    return origins, dlqs, expected


def set_deduplication(admin: Any, topic: str, enabled: bool, timeout_s: float = 60.0) -> None:
    """Turn deduplication on or off for ``topic`` (a topic policy) and wait until the broker applies it
    (policies travel through a system topic, and a topic turns deduplication on asynchronously)."""
    path = "/admin/v2/persistent/" + topic.removeprefix("persistent://")
    admin.request("POST", path + "/deduplicationEnabled", enabled)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        applied = admin.get(path + "/deduplicationEnabled?applied=true")
        status = admin.get(path + "/stats").get("deduplicationStatus")
        if applied is enabled and (status == "Enabled") is enabled:
            return
        time.sleep(0.1)
    raise AssertionError(
        f"deduplication of {topic} did not turn {'on' if enabled else 'off'} in {timeout_s} s"
    )


def received_on(admin: Any, topics: list[str]) -> int:
    """Messages the broker received on ``topics`` (stored, and re-sent copies it dropped)."""
    total = 0
    for topic in topics:
        total += int(
            admin.get("/admin/v2/persistent/" + topic.removeprefix("persistent://") + "/stats")[
                "msgInCounter"
            ]
        )
    return total


def kill_when_received(
    proc: Any, admin: Any, origins: list[str], at_least: int, out: Path, run_id: str
) -> dict[str, Any]:
    """SIGKILL the spark-submit tree inside the first wave in flight once the origins received
    ``at_least`` messages; returns the apply step's progress at the kill.

    The tree is stopped (SIGSTOP) while the state is read; when the received count was reached between
    two waves (the driver saving a wave's results), the tree goes on (SIGCONT) and the kill waits for the
    next wave, so each attempt dies while a wave is being sent."""
    deadline = time.monotonic() + 600
    while True:
        assert proc.poll() is None, f"the run exited ({proc.returncode}) before a kill inside a wave"
        assert time.monotonic() < deadline, f"no wave was in flight after {at_least} were received"
        if received_on(admin, origins) < at_least:
            time.sleep(0.02)
            continue
        procs = tree(proc)
        signal_tree(procs, 19)  # SIGSTOP: nothing moves while the state is read
        progress = state_of(out, run_id).get("steps", {}).get("apply", {})
        if "wave_in_flight" in progress or progress.get("status") != "running":
            break
        signal_tree(procs, 18)  # SIGCONT: between two waves, wait for the next one
        time.sleep(0.05)
    signal_tree(procs, 9)
    proc.wait(timeout=60)
    return progress


def args(
    service_url: str, admin_url: str, dlqs: list[str], out: Path, run_id: str, wave: str | None
) -> list[str]:
    return [
        "--run-id", run_id, "--mode", "replay", "--service-url", service_url, "--admin-url", admin_url,
        "--topics", ",".join(dlqs), "--output-dir", str(out), "--playbook", PLAYBOOK,
        "--origin-allowlist", "orders-*", "--idle-timeout-ms", "1500", "--parallelism", str(PARALLELISM),
        "--rate-limit", RATES[wave], *(("--wave-size", wave) if wave else ()),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("wave", "dedup"),
    [(None, True), ("500", False)],
    ids=["default-waves-dedup", "small-waves-no-dedup"],
)
def test_sigkill_inside_waves_again_and_again(
    wave, dedup, pulsar_broker, pulsar_client, fault_bundle, fault_table, tmp_path
):
    admin = AdminClient(pulsar_broker.admin_url)
    origins, dlqs, expected = build_dlqs(pulsar_client)
    for origin in origins:
        set_deduplication(admin, origin, dedup)
    out, run_id = tmp_path / "out", f"mid-wave-{uuid.uuid4().hex[:6]}"
    command = args(pulsar_broker.service_url, pulsar_broker.admin_url, dlqs, out, run_id, wave)
    to_send = ORIGINS * REPLAY
    killed_in: list[str] = []
    for k in range(1, KILLS + 1):
        proc = start(fault_bundle, command, tmp_path, f"attempt-{k}")
        progress = kill_when_received(proc, admin, origins, k * to_send // (KILLS + 1) + 137 * k, out, run_id)
        assert progress.get("status") == "running", progress
        assert "wave_in_flight" in progress, f"the kill did not land inside a wave: {progress}"
        killed_in.append(f"wave {progress['wave_in_flight'] + 1} of size {progress.get('wave_size')}")
    summary = finish(start(fault_bundle, command, tmp_path, "last"), tmp_path, "last")

    totals = summary["totals"]
    resend = json.loads((out / "runs" / run_id / "report.json").read_text())["resend"]
    archived = [r["key"] for r in _archive_keys(out)]
    state = end_state(pulsar_client, origin=origins, dlqs=dlqs, expected=expected, archived_keys=archived)
    assert summary["status"] == "succeeded"
    assert (totals["republished"], totals["archived"], totals["acked"]) == (
        to_send,
        ORIGINS * ARCHIVE,
        len(expected),
    )
    assert state.lost == 0, state.details
    assert state.misplaced == 0, state.details
    assert state.pending == 0
    assert totals["resent"] > 0
    if dedup:
        assert state.doubled == 0, state.details
        assert 0 < resend["resent_held"] <= totals["resent"]
    else:
        assert resend["resent_held"] == 0
        assert state.doubled <= totals["resent"] <= resend["resend_bound"]
    fault_table.record(
        FaultRow(
            category="kill-mid-wave",
            case=f"{'default' if wave is None else 'small'}-waves-{'dedup' if dedup else 'no-dedup'}",
            fault=f"{KILLS} SIGKILLs of the spark-submit tree inside waves ({', '.join(killed_in)}), "
            f"each resumed; {len(expected)} DLQ messages, {to_send} republished",
            expected="nothing lost; nothing doubled with deduplication, else at most `resent` (within "
            "its bound)",
            result=f"exit 0 on Apache Pulsar (deduplication {'on' if dedup else 'off'}): republished "
            f"{totals['republished']}, acked {totals['acked']}, resent {totals['resent']} (broker held "
            f"{resend.get('resent_held')}, bound {resend.get('resend_bound')})",
            lost=state.lost,
            doubled=state.doubled,
            pending=state.pending,
        )
    )


def _archive_keys(out: Path) -> list[dict[str, Any]]:
    import pyarrow.dataset as ds

    return ds.dataset(str(out / "archive"), format="parquet").to_table(columns=["key"]).to_pylist()
