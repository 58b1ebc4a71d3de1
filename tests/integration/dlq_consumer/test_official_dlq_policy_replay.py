"""The official client's dead-letter policy feeds the replay app, end to end on Apache Pulsar.

A plain ``pulsar-client`` consumer (no library of ours) with ``ConsumerDeadLetterPolicy(max_redeliver_count,
dead_letter_topic, initial_subscription_name)`` dead-letters poison messages; the DLQ's replayer
subscription is the one that policy created; the replay app (in-process, on the session Spark) republishes
them to the origin with lineage and acks them; the application gets them back.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections import Counter

import pulsar
import pytest

from airflow_provider_dlq.hooks.pulsar import PulsarHook

pytestmark = [pytest.mark.integration, pytest.mark.real_pulsar]

LOG = logging.getLogger(__name__)
REPLAYER = "dlq-replayer"
MAX_REDELIVER = 2
N = 6

PLAYBOOK = """\
version: 1
rules:
  - name: replay-official-dlq
    description: Messages the official client dead-lettered after too many redeliveries.
    match:
      context_format: pulsar_dlq_policy
      origin_topic: "persistent://acme/orders/checkout-*"
    action: republish
"""


def payload(i: int) -> bytes:
    return json.dumps({"order_id": f"order-{i}", "amount": 10 + i}).encode()


def index(key: str) -> int:
    return int(key.rsplit("-", 1)[1])


def subscription_stats(broker, topic: str) -> dict:
    path = topic.replace("persistent://", "/admin/v2/persistent/", 1)
    return broker.admin().get(f"{path}/stats")["subscriptions"]


def test_official_dead_letter_policy_then_replay_end_to_end(
    spark, pulsar_broker, pulsar_client, tmp_path, monkeypatch
):
    from spark_apps.dlq_replay import outcomes as oc
    from spark_apps.dlq_replay.options import ReplayOptions
    from spark_apps.dlq_replay.pulsar_io import conf
    from spark_apps.dlq_replay.runner import run_replay

    origin = f"persistent://acme/orders/checkout-{uuid.uuid4().hex[:8]}"
    dlq_topic = f"{origin}-app-DLQ"
    app = pulsar_client.subscribe(
        origin,
        "app",
        consumer_type=pulsar.ConsumerType.Shared,
        negative_ack_redelivery_delay_ms=100,
        initial_position=pulsar.InitialPosition.Earliest,
        dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(
            max_redeliver_count=MAX_REDELIVER,
            dead_letter_topic=dlq_topic,
            initial_subscription_name=REPLAYER,
        ),
    )
    producer = pulsar_client.create_producer(origin, batching_enabled=True, batching_max_publish_delay_ms=5)
    sent = {}
    for i in range(N):
        key = f"order-{i}"
        sent[key] = producer.send(
            payload(i),
            partition_key=key,
            ordering_key=f"customer-{i % 2}",
            properties={"tenant": "acme", "trace": f"t-{i}"},
            event_timestamp=1_700_000_000_000 + i,
        )
    producer.close()

    # ---- the application fails every message; the client's policy moves them to the DLQ.
    deliveries: Counter[str] = Counter()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            msg = app.receive(timeout_millis=3000)
        except pulsar.Timeout:
            if sum(deliveries.values()) >= N * (MAX_REDELIVER + 1):
                break
            continue
        deliveries[msg.partition_key()] += 1
        app.negative_acknowledge(msg)
    assert deliveries == {key: MAX_REDELIVER + 1 for key in sent}  # first delivery + 2 redeliveries

    # The replayer subscription exists because initial_subscription_name created it, with every message.
    stats = subscription_stats(pulsar_broker, dlq_topic)
    assert REPLAYER in stats, sorted(stats)
    assert stats[REPLAYER]["msgBacklog"] == N  # the client's DLQ producer does not batch: entries = messages
    monkeypatch.setenv(
        "AIRFLOW_CONN_PULSAR_DEFAULT",
        json.dumps(
            {
                "conn_type": "pulsar",
                "host": pulsar_broker.service_url,
                "extra": {"admin_url": pulsar_broker.admin_url},
            }
        ),
    )
    before = PulsarHook().get_backlog([dlq_topic], REPLAYER)[dlq_topic]
    assert (before.backlog, before.exact) == (N, True)
    # What the client's DLQ copies carry (a Reader does not touch the replayer subscription).
    reader = pulsar_client.create_reader(dlq_topic, pulsar.MessageId.earliest)
    copies = {}
    while len(copies) < N:
        copy = reader.read_next(timeout_millis=5000)
        copies[copy.partition_key()] = copy
    reader.close()
    for key, copy in copies.items():
        assert copy.properties()["REAL_TOPIC"] == origin
        assert copy.properties()["ORIGIN_MESSAGE_ID"]  # the C++ client writes "(ledger,entry,part,batch)"
        assert copy.ordering_key() == f"customer-{index(key) % 2}"
        assert copy.data() == payload(index(key))

    # ---- the replay app: snapshot, decide, republish with lineage, record, commit (ack), report.
    playbook = tmp_path / "official.yaml"
    playbook.write_text(PLAYBOOK)
    options = ReplayOptions(
        run_id="official-1",
        mode=oc.REPLAY,
        service_url=pulsar_broker.service_url,
        topics=(dlq_topic,),
        output_dir=str(tmp_path / "out"),
        playbook=str(playbook),
        origin_allowlist=("persistent://acme/orders/checkout-*",),
        idle_timeout_ms=1500,
    )
    try:
        report = run_replay(spark, options)
    finally:
        conf.close_own_clients()
    totals = report["totals"]
    LOG.info("replay of the official client's DLQ: %s", totals)
    print(f"\nofficial DLQ policy -> replay: totals {json.dumps({k: v for k, v in totals.items() if v})}")
    assert report["status"] == "succeeded"
    assert totals["snapshot"] == totals[oc.REPUBLISHED] == totals["acked"] == N
    assert totals["left_pending"] == 0
    assert sum(v for k, v in totals.items() if k in oc.OUTCOMES and k != oc.REPUBLISHED) == 0
    (group,) = report["groups"]
    assert (group["context_format"], group["origin_topic"]) == ("pulsar_dlq_policy", origin)
    assert group["count"] == N
    assert group["rules"] == ["replay-official-dlq"]

    # ---- the application gets every message back once, with lineage, and this time acks it.
    replayed = {}
    deadline = time.monotonic() + 30
    while len(replayed) < N and time.monotonic() < deadline:
        try:
            msg = app.receive(timeout_millis=1000)
        except pulsar.Timeout:
            continue
        assert msg.partition_key() not in replayed, "replayed twice"
        replayed[msg.partition_key()] = msg
        app.acknowledge(msg)
    assert sorted(replayed) == sorted(sent)
    for key, msg in replayed.items():
        props = msg.properties()
        assert msg.data() == payload(index(key))
        assert (props["tenant"], props["trace"]) == ("acme", f"t-{index(key)}")
        assert msg.ordering_key() == copies[key].ordering_key()
        # pulsar-client 3.13's DLQ copy drops the event time (0); the replay keeps what the copy has.
        assert msg.event_timestamp() == copies[key].event_timestamp()
        assert props["REPLAY_RUN_ID"] == "official-1"
        assert props["REPLAY_COUNT"] == "1"
        assert props["REPLAYED_FROM"] == dlq_topic
        assert len(props["REPLAY_ID"]) == 32
        assert props["REPLAY_FIX"] == ""
        assert "REAL_TOPIC" not in props
        assert "ORIGIN_MESSAGE_ID" not in props
    assert len({m.properties()["REPLAY_ID"] for m in replayed.values()}) == N
    with pytest.raises(pulsar.Timeout):
        app.receive(timeout_millis=1500)  # nothing more: no duplicates
    app.close()

    # ---- the DLQ is done with: the replayer subscription holds nothing, and the ledger says final.
    after = PulsarHook().get_backlog([dlq_topic], REPLAYER)[dlq_topic]
    assert (after.backlog, after.exact) == (0, True)
    assert subscription_stats(pulsar_broker, dlq_topic)[REPLAYER]["msgBacklog"] == 0
    ledger = spark.read.parquet(str(tmp_path / "out" / "ledger"))
    assert ledger.count() == N
    assert ledger.filter("final").count() == N
    assert {r["origin_topic"] for r in ledger.select("origin_topic").collect()} == {origin}
    assert {r["context_format"] for r in ledger.select("context_format").collect()} == {"pulsar_dlq_policy"}
