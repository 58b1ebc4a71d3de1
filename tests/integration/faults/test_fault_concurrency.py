"""Fault suite, concurrency: two replays started together on the same DLQ subscription, with the same
output directory or with different ones. Exactly one runs; the other exits 1 naming the run that holds
the lock or the lease and writes nothing; every message reaches the origin once."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from fault_support import CASES, FaultRow, app_output, end_state, start

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
PLAYBOOK = str(REPO / "examples" / "playbooks" / "orders.yaml")
REPLAY, SKIP = 600, 30


def build_dlq(client: Any) -> tuple[str, str, dict[str, str]]:
    u = uuid.uuid4().hex[:8]
    origin = f"persistent://public/default/orders-{u}"
    dlq = f"persistent://public/default/orders-{u}-sub-DLQ"
    producer = client.create_producer(dlq, batching_enabled=False)
    expected = {}
    for i in range(REPLAY + SKIP):
        cls = "TimeoutError" if i < REPLAY else "RuntimeError"
        key = f"{'t' if i < REPLAY else 's'}-{i}"
        props = {
            "REAL_TOPIC": origin,
            "ORIGIN_MESSAGE_ID": f"7:{i}:-1:-1",
            "__dlq.errors.reason": "term",
            "__dlq.errors.exception.class": cls,
            "__dlq.errors.exception.message": "x",
        }
        producer.send(b'{"order_id": "ORD-1"}', properties=props, partition_key=key)
        expected[key] = "republished" if i < REPLAY else "skipped"
    producer.close()
    return origin, dlq, expected


@pytest.mark.parametrize("case", CASES["concurrency"])
def test_two_replays_at_once_never_interleave(
    case, spark, pulsar_broker, pulsar_client, fault_bundle, fault_table, tmp_path
):
    origin, dlq, expected = build_dlq(pulsar_client)
    outs = [tmp_path / "out", tmp_path / ("out" if case == "same-output-dir" else "other-out")]
    procs = []
    for n, out in enumerate(outs):
        argv = [
            "--run-id", f"together-{n}", "--mode", "replay", "--service-url", pulsar_broker.service_url,
            "--topics", dlq, "--output-dir", str(out), "--playbook", PLAYBOOK,
            "--origin-allowlist", "orders-*", "--idle-timeout-ms", "1500", "--rate-limit", "100",
        ]  # fmt: skip
        procs.append(start(fault_bundle, argv, tmp_path, f"run{n}"))
    codes = [p.wait(timeout=1200) for p in procs]
    assert sorted(codes) == [0, 1], [app_output(tmp_path, f"run{n}")[-3000:] for n in range(2)]
    winner, loser = (0, 1) if codes[0] == 0 else (1, 0)
    loser_err = app_output(tmp_path, f"run{loser}")
    refusal = next(line for line in loser_err.splitlines() if "another replay run" in line)
    # Same output root: the loser finds the winner's lock ("holds"), or both reach the lock together and the
    # loser's conditional create fails ("took ... at the same moment"); either names the root and the fix.
    wanted = ("holds the output directory", "took the output directory") if case == "same-output-dir" else ()
    assert any(phrase in refusal for phrase in wanted or ("is reading DLQ topic",)), refusal
    assert not (outs[loser] / "runs" / f"together-{loser}").exists()  # the loser wrote nothing
    state = end_state(pulsar_client, origin=origin, dlqs=[dlq], expected=expected, archived_keys=[])
    assert state.lost == state.misplaced == state.doubled == 0, state.details
    assert state.pending == SKIP
    ledger = spark.read.parquet(str(outs[winner] / "ledger"))
    assert ledger.count() == ledger.select("dlq_message_id").distinct().count() == len(expected)
    fault_table.record(
        FaultRow(
            category="concurrency",
            case=case,
            fault="two replays (different run ids) of one DLQ subscription started together, "
            + ("same `--output-dir`" if case == "same-output-dir" else "different `--output-dir`s"),
            expected="one runs; the other exits 1 naming the holder and writes nothing; nothing doubled",
            result=f"one exit 0, the other exit 1: {refusal.split('error: ', 1)[-1][:120]}",
            lost=state.lost,
            doubled=state.doubled,
            pending=state.pending,
        )
    )
