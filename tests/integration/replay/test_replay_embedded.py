"""Smoke suite on the embedded pulsar-lite broker (the demo's zero-setup default).

pulsar-lite has no admin REST and accepts acks only from the consumer that received a message, so the
replay takes its Shared-consumer path there (snapshot, then a second read that acks). One mixed DLQ run
proves that path end to end: dry-run changes nothing, replay republishes and acks exactly the final
messages, the rest stays pending.
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
    """Two messages an entry, so entries are whole (both final), partial or pending: the commit acks each
    final message from the consumer that receives it, whole entries without looking an id up; a batch
    holding a pending message stays in the backlog whole (no batch-index acks), and the next run
    republishes nothing again."""
    mixed = build_mixed_dlq(lite_client, per_kind=3, batch=2)
    out = tmp_path / "out"

    def options(run_id: str) -> ReplayOptions:
        return replay_options(lite_broker, mixed, out, run_id, oc.REPLAY)

    report = run_replay(spark, options("lite-batched-1"))
    assert report["status"] == "succeeded"
    final, pending = set(mixed.keys(*FINAL)), set(mixed.keys(*PENDING))
    assert report["totals"]["acked"] == len(final)
    assert report["commit"]["unacked_final"] == 0
    state = json.loads((out / "runs" / "lite-batched-1" / "state.json").read_text())
    in_whole = state["steps"]["commit"]["final_in_whole_entries"]
    assert 0 < in_whole < len(final)  # some entries whole, the others holding a pending message
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
    assert again["totals"]["acked"] == sum(len(keys & final) for keys in by_entry.values())
