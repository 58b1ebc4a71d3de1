"""A 4-partition DLQ replayed completely on Apache Pulsar (reader mode), checked through admin REST."""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import replace
from typing import Any

import pulsar
import pytest
from replay_e2e_support import PLAYBOOK, close_driver_clients, order, ours

from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay.options import ReplayOptions
from spark_apps.dlq_replay.pulsar_io.admin import PulsarAdmin
from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf
from spark_apps.dlq_replay.runner import run_replay

pytestmark = pytest.mark.integration

PARTITIONS = 4


@pytest.fixture(autouse=True, scope="module")
def _close_clients_after_module():
    yield
    close_driver_clients()


def read_all(client: Any, topic: str) -> list[Any]:
    """Every message of a (non-partitioned) topic, with a Reader: exact, and it acks nothing."""
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    out = []
    try:
        while reader.has_message_available():
            out.append(reader.read_next(10_000))
    finally:
        reader.close()
    return out


def test_partitioned_dlq_is_replayed_completely(spark, pulsar_broker, pulsar_client, tmp_path):
    u = uuid.uuid4().hex[:8]
    orders = f"persistent://public/default/orders-{u}"
    dlq = f"persistent://public/default/orders-{u}-sub-DLQ"
    pulsar_broker.admin().create_partitioned_topic(dlq, PARTITIONS)
    kinds = {  # key prefix -> (count, payload, (error class, message), outcome)
        "t": (1_200, order(1), ("TimeoutError", "inventory timed out after 30s"), oc.REPUBLISHED),
        "a": (400, b"<xml/>", ("json.decoder.JSONDecodeError", "Expecting value"), oc.ARCHIVED),
        "s": (400, order(2), ("RuntimeError", "unknown"), oc.SKIPPED),
    }
    producer = pulsar_client.create_producer(
        dlq, batching_enabled=False, block_if_queue_full=True, max_pending_messages=5_000
    )
    results: list[Any] = []
    for prefix, (count, payload, (cls, text), _) in kinds.items():
        for i in range(count):  # each a distinct original (its own origin message id)
            producer.send_async(
                payload,
                lambda r, _m: results.append(r),
                properties=ours(orders, cls, text),
                partition_key=f"{prefix}-{i}",
            )
    producer.flush()
    producer.close()
    assert results == [pulsar.Result.Ok] * 2_000

    options = ReplayOptions(
        run_id="part-1",
        mode=oc.REPLAY,
        service_url=pulsar_broker.service_url,
        admin_url=pulsar_broker.admin_url,
        topics=(dlq,),
        output_dir=str(tmp_path / "out"),
        playbook=PLAYBOOK,
        origin_allowlist=("orders-*",),
        idle_timeout_ms=1500,
    )
    report = run_replay(spark, options)
    totals = report["totals"]
    assert report["status"] == "succeeded"
    assert (totals["snapshot"], totals[oc.REPUBLISHED], totals[oc.ARCHIVED], totals[oc.SKIPPED]) == (
        2_000,
        1_200,
        400,
        400,
    )
    assert (totals["acked"], totals["left_pending"]) == (1_600, 400)
    commit = report["commit"]
    assert (commit["read_mode"], commit["reads_per_message"], commit["unacked_final"]) == ("reader", 1.0, 0)

    # Every partition was read and committed: what is left on each is exactly its skipped messages.
    ledger = spark.read.parquet(str(tmp_path / "out" / "ledger"))
    skipped_by_partition = Counter(
        r.dlq_topic for r in ledger.filter(f"outcome = '{oc.SKIPPED}'").select("dlq_topic").collect()
    )
    assert {r.dlq_topic for r in ledger.select("dlq_topic").distinct().collect()} == {
        f"{dlq}-partition-{p}" for p in range(PARTITIONS)
    }
    admin = PulsarAdmin(PulsarConf(pulsar_broker.service_url, admin_url=pulsar_broker.admin_url))
    backlog = {
        f"{dlq}-partition-{p}": admin.stats(f"{dlq}-partition-{p}")["subscriptions"]["dlq-replayer"][
            "msgBacklog"
        ]
        for p in range(PARTITIONS)
    }
    assert backlog == {t: skipped_by_partition.get(t, 0) for t in backlog}
    assert sum(backlog.values()) == 400

    # The origin got each republished message once.
    replayed = read_all(pulsar_client, orders)
    assert len(replayed) == 1_200
    assert {m.partition_key() for m in replayed} == {f"t-{i}" for i in range(1_200)}
    assert len({m.properties()["REPLAY_ID"] for m in replayed}) == 1_200

    # A second run reads only what is pending (the skipped ones) and changes nothing.
    again = run_replay(spark, replace(options, run_id="part-2"))
    assert again["totals"]["snapshot"] == 400
    assert (again["totals"]["acked"], again["totals"][oc.REPUBLISHED]) == (0, 0)
    assert len(read_all(pulsar_client, orders)) == 1_200
