"""Fault suite, kills: SIGKILL of the whole spark-submit tree while each of the seven steps runs, in
turn in one run, each launch resuming the last with the same run id. Nothing may be lost, nothing doubled
(the session broker deduplicates; a kill in apply re-sends the wave in flight, counted as ``resent``),
the skipped messages stay pending, and the totals of the last launch are exact. Kills at many points
inside waves: ``test_fault_mid_wave.py``."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from fault_support import CASES, FaultRow, dlq_properties, end_state, finish, kill_in_step, start

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
PLAYBOOK = str(REPO / "examples" / "playbooks" / "orders.yaml")
TOPICS, REPLAY, ARCHIVE, SKIP = 6, 90, 15, 15
WAVE, PRODUCERS = 40, 2


def broker_kind(broker: Any) -> str:
    return "Apache Pulsar" if hasattr(broker, "admin_url") else "embedded pulsar-lite"


def build_dlqs(client: Any) -> tuple[str, list[str], dict[str, str]]:
    """``TOPICS`` DLQ topics, each with republish / archive / skip messages, one entry per message."""
    u = uuid.uuid4().hex[:8]
    origin = f"persistent://public/default/orders-{u}"
    dlqs = [f"persistent://public/default/orders-{u}-sub{t}-DLQ" for t in range(TOPICS)]
    expected: dict[str, str] = {}
    n = 0
    for t, dlq in enumerate(dlqs):
        producer = client.create_producer(dlq, batching_enabled=False)
        for kind, count, cls, message, outcome in (
            ("t", REPLAY, "TimeoutError", "inventory timed out after 30s", "republished"),
            ("a", ARCHIVE, "json.decoder.JSONDecodeError", "Expecting value", "archived"),
            ("s", SKIP, "RuntimeError", "unknown", "skipped"),
        ):
            for i in range(count):
                key = f"{kind}-{t}-{i}"
                props = dlq_properties(origin, cls, message, n)
                producer.send(b'{"order_id": "ORD-1", "amount": 1}', properties=props, partition_key=key)
                expected[key] = outcome
                n += 1
        producer.close()
    return origin, dlqs, expected


def args(service_url: str, dlqs: list[str], out: Path, run_id: str, *extra: str) -> list[str]:
    return [
        "--run-id", run_id, "--mode", "replay", "--service-url", service_url, "--topics", ",".join(dlqs),
        "--output-dir", str(out), "--playbook", PLAYBOOK, "--origin-allowlist", "orders-*",
        "--idle-timeout-ms", "1500", "--parallelism", str(PRODUCERS), "--wave-size", str(WAVE), *extra,
    ]  # fmt: skip


def test_sigkill_in_each_step_in_turn_then_resume(
    spark, pulsar_broker, pulsar_client, fault_bundle, fault_table, tmp_path
):
    """One run, killed seven times: each launch resumes what the last one left and is killed while the
    next step runs (plan, snapshot, ..., report); an eighth launch finishes it with exact totals."""
    kill_in_turn_then_resume(
        CASES["kill"], spark, pulsar_broker, pulsar_client, fault_bundle, fault_table, tmp_path
    )


def kill_in_turn_then_resume(
    steps: tuple[str, ...], spark, pulsar_broker, pulsar_client, fault_bundle, fault_table, tmp_path
) -> None:
    """Kill one run in each of ``steps`` in turn (each launch resuming the last), then finish it; check
    the totals and the topics, and record a fault-table row per step (the broker matrix reuses this)."""
    origin, dlqs, expected = build_dlqs(pulsar_client)
    out = tmp_path / "out"
    run_id = "kill-" + "-".join(steps)
    url = pulsar_broker.service_url
    for step in steps:
        name = f"killed-in-{step}"
        slow = ("--rate-limit", "150") if step == "apply" else ()  # several waves in flight-able time
        launch = start(fault_bundle, args(url, dlqs, out, run_id, *slow), tmp_path, name)
        # In apply, kill while a wave is being sent (one wave saved, the next in flight).
        in_flight = (
            (lambda p: p.get("waves_done", 0) >= 1 and "wave_in_flight" in p) if step == "apply" else None
        )
        status = kill_in_step(launch, out, run_id, step, in_flight)
        assert status == "running", f"the kill landed after step {step} ended ({status}); nothing was tested"
        # The killed driver's Spark dirs are in the test's temp dir (see fault_support.start), not in /tmp.
        assert any((tmp_path / f"{name}-jvm-tmp").glob("spark-*")), sorted(
            (tmp_path / f"{name}-jvm-tmp").iterdir()
        )

    summary = finish(
        start(fault_bundle, args(url, dlqs, out, run_id), tmp_path, "resume"), tmp_path, "resume"
    )
    totals = summary["totals"]
    n_final = TOPICS * (REPLAY + ARCHIVE)
    assert summary["status"] == "succeeded"
    assert totals["snapshot"] == len(expected)
    assert (totals["republished"], totals["archived"], totals["skipped"]) == (
        TOPICS * REPLAY,
        TOPICS * ARCHIVE,
        TOPICS * SKIP,
    )
    assert totals["acked"] == n_final  # exact though the commit was killed half-way
    assert totals["left_pending"] == TOPICS * SKIP
    archived = [r["key"] for r in spark.read.parquet(str(out / "archive")).select("key").collect()]
    assert len(archived) == len(set(archived)) == TOPICS * ARCHIVE
    ledger = spark.read.parquet(str(out / "ledger"))
    assert ledger.count() == len(expected)
    state = end_state(pulsar_client, origin=origin, dlqs=dlqs, expected=expected, archived_keys=archived)
    assert state.lost == 0, state.details
    assert state.misplaced == 0, state.details
    assert state.pending == TOPICS * SKIP
    # The wave in flight when apply was killed is sent again (counted as resent); the broker deduplicates.
    resent = totals["resent"]
    if "apply" in steps:
        assert 0 < resent <= WAVE * PRODUCERS
    else:
        assert resent == 0
    assert state.doubled == 0
    in_turn = " (one run, killed in each step in turn)" if len(steps) > 1 else ""
    for step in steps:
        fault_table.record(
            FaultRow(
                category="kill",
                case=step,
                fault=f"SIGKILL of the spark-submit tree (JVM, Python driver, workers) during `{step}`, then "
                f"the same command again{in_turn}",
                expected="the next launch resumes; the last exits 0; exact totals; skipped ones pending"
                + (
                    "; the wave in flight sent again (`resent`) and dropped by broker deduplication"
                    if step == "apply"
                    else ""
                ),
                result=f"exit 0 on {broker_kind(pulsar_broker)}: {len(expected)} messages, republished "
                f"{totals['republished']}, archived {totals['archived']}, acked {totals['acked']}, "
                f"resent {resent}",
                lost=state.lost,
                doubled=state.doubled,
                pending=state.pending,
            )
        )
