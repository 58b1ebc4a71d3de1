"""Smoke suite on the embedded pulsar-lite broker (the demo's zero-setup default).

pulsar-lite has no admin REST and accepts acks only from the consumer that received a message, so the
replay takes its Shared-consumer path there (a snapshot whose consumers the held reads keep open for the
commit's acks, or without them a second read that acks). One mixed DLQ run proves that path end to end:
dry-run changes nothing, replay republishes and acks exactly the final messages, the rest stays pending.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from replay_e2e_support import (
    PLAYBOOK,
    MixedDlq,
    build_mixed_dlq,
    close_driver_clients,
    drain,
    expected_totals,
    pending_keys,
)

from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay.options import ReplayOptions
from spark_apps.dlq_replay.runner import run_replay

pytestmark = [pytest.mark.integration, pytest.mark.embedded]

FINAL = (oc.REPUBLISHED, oc.ARCHIVED, oc.DROPPED, oc.LOOP_GUARDED)
PENDING = (oc.SKIPPED, oc.FIX_FAILED, oc.MALFORMED, oc.ORIGIN_REFUSED)


@pytest.fixture
def lite_client(lite_broker):
    import pulsar

    client = pulsar.Client(lite_broker.service_url, logger=logging.getLogger("pulsar.lite"))
    yield client
    close_driver_clients()
    client.close()


def replay_options(broker: Any, mixed: MixedDlq, out: Path, run_id: str, mode: str) -> ReplayOptions:
    """A run over both DLQs of ``mixed`` on the embedded ``broker``, writing to ``out``."""
    return ReplayOptions(
        run_id=run_id,
        mode=mode,
        service_url=broker.service_url,
        topics=(mixed.dlq_a, mixed.dlq_b),
        output_dir=str(out),
        playbook=PLAYBOOK,
        origin_allowlist=("orders-*",),
        idle_timeout_ms=1500,
    )


def test_replay_on_the_embedded_broker(spark, lite_broker, lite_client, tmp_path):
    mixed = build_mixed_dlq(lite_client, per_kind=2)
    everything = sorted(mixed.expected)
    out = tmp_path / "out"

    def options(run_id: str, mode: str) -> ReplayOptions:
        return replay_options(lite_broker, mixed, out, run_id, mode)

    want = expected_totals(mixed)
    dry = run_replay(spark, options("lite-dry", oc.DRY_RUN))
    assert {k: v for k, v in dry["totals"].items() if k in want and v} == want
    assert pending_keys(lite_client, mixed) == everything

    report = run_replay(spark, options("lite-1", oc.REPLAY))
    assert report["status"] == "succeeded"
    final = mixed.keys(*FINAL)
    assert report["totals"]["acked"] == len(final)
    replayed = drain(lite_client, mixed.orders, "verify-lite")
    assert sorted(m.partition_key() for m in replayed) == sorted(mixed.keys(oc.REPUBLISHED))
    assert pending_keys(lite_client, mixed) == sorted(mixed.keys(*PENDING))


def test_batches_mixing_final_and_pending_messages(spark, lite_broker, lite_client, tmp_path):
    """Two messages an entry, so entries are whole (both final), partial or pending: the commit acks the
    whole entries (read again: the embedded broker takes an ack only from the receiving consumer); a
    batch holding a pending message stays in the backlog whole (no batch-index acks), its final messages
    counted, and the next run republishes nothing again."""
    mixed = build_mixed_dlq(lite_client, per_kind=3, batch=2)
    out = tmp_path / "out"

    def options(run_id: str) -> ReplayOptions:
        return replay_options(lite_broker, mixed, out, run_id, oc.REPLAY)

    report = run_replay(spark, options("lite-batched-1"))
    assert report["status"] == "succeeded"
    final, pending = set(mixed.keys(*FINAL)), set(mixed.keys(*PENDING))
    commit = report["commit"]
    assert report["totals"]["acked"] + commit["final_in_partial_entries"] == len(final)
    assert commit["unacked_final"] == 0
    assert commit["reads_per_message"] >= 2.0  # the window read again (a stall can add repeats)
    state = json.loads((out / "runs" / "lite-batched-1" / "state.json").read_text())
    steps = state["steps"]
    in_whole = steps["commit"]["final_in_whole_entries"]
    assert 0 < in_whole < len(final)  # some entries whole, the others holding a pending message
    assert report["totals"]["acked"] == in_whole
    left = drain(lite_client, [mixed.dlq_a, mixed.dlq_b], "dlq-replayer")
    by_entry: dict[tuple[str, int, int], set[str]] = {}
    for m in left:
        mid = m.message_id()
        by_entry.setdefault((m.topic_name(), mid.ledger_id(), mid.entry_id()), set()).add(m.partition_key())
    assert pending <= {key for keys in by_entry.values() for key in keys}
    assert all(keys & pending for keys in by_entry.values())  # only batches holding a pending message
    replayed = drain(lite_client, mixed.orders, "verify-lite-batched")
    assert sorted(m.partition_key() for m in replayed) == sorted(mixed.keys(oc.REPUBLISHED))

    again = run_replay(spark, options("lite-batched-2"))
    assert again["status"] == "succeeded"
    again_replayed = drain(lite_client, mixed.orders, "verify-lite-batched")  # drains never ack: once each
    assert sorted(m.partition_key() for m in again_replayed) == sorted(mixed.keys(oc.REPUBLISHED))
    # The batches left each still hold a pending message: nothing acked, their final messages counted.
    assert again["totals"]["acked"] == 0
    assert again["commit"]["final_in_partial_entries"] == sum(len(keys & final) for keys in by_entry.values())
    still = drain(lite_client, [mixed.dlq_a, mixed.dlq_b], "dlq-replayer")
    assert sorted(m.partition_key() for m in still) == sorted(m.partition_key() for m in left)


def test_a_run_stopped_between_snapshot_and_commit_leaves_everything_pending(
    spark, lite_broker, lite_client, tmp_path, monkeypatch
):
    """A run that fails after apply (the record step raises here) acks nothing: every message is pending
    again, and the resumed run (same run id) acks exactly the final ones by reading the window again,
    republishing nothing twice (the ledger and the saved send results)."""
    from spark_apps.dlq_replay import runner

    mixed = build_mixed_dlq(lite_client, per_kind=2)
    out = tmp_path / "out"
    record = runner.run_record

    def broken_record(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the ledger's disk is full")

    monkeypatch.setattr(runner, "run_record", broken_record)
    with pytest.raises(RuntimeError, match="disk is full"):
        run_replay(spark, replay_options(lite_broker, mixed, out, "lite-stopped", oc.REPLAY))
    assert pending_keys(lite_client, mixed) == sorted(mixed.expected)  # nothing acked, nothing lost

    monkeypatch.setattr(runner, "run_record", record)
    report = run_replay(spark, replay_options(lite_broker, mixed, out, "lite-stopped", oc.REPLAY))
    assert report["status"] == "succeeded"
    assert report["totals"]["acked"] == len(mixed.keys(*FINAL))
    assert report["commit"]["reads_per_message"] >= 2.0  # the resumed commit read the window again
    assert pending_keys(lite_client, mixed) == sorted(mixed.keys(*PENDING))
    replayed = drain(lite_client, mixed.orders, "verify-lite-stopped")
    assert sorted(m.partition_key() for m in replayed) == sorted(mixed.keys(oc.REPUBLISHED))
