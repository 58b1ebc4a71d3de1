"""Origin identity (one REPLAY_ID per original), conflicting origins and precise reasons for parked
messages, on Arrow batches (pure functions, no Spark)."""

from __future__ import annotations

import pytest
from test_replay_decide_batch import DLQ, ORDERS, by_key, normalize_batch, ours, scoped, snapshot_batch

from pulsar_dlq_consumer.context import (
    canonical_message_id,
    conflicting_claims,
    origin_claims,
    origin_identity,
    resolve_claims,
)
from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay.decide import DecideSettings, decide_batch
from spark_apps.dlq_replay.normalize import ORIGIN_CONFLICT, normalize_columns
from spark_apps.dlq_replay.playbook import parse_playbook
from spark_apps.dlq_replay.pulsar_io.source import UNDECODABLE_PROPERTY
from spark_apps.dlq_replay.topics import TopicMatcher

REPLAY_ALL = parse_playbook("rules: [{name: all, action: republish}]")
SETTINGS = DecideSettings("run-1", oc.REPLAY, allowlist=TopicMatcher.parse(["orders", "payments"]))


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("(12,34,-1,-1)", "12:34:-1:-1"),  # Python client str(MessageId)
        ("12:34:-1", "12:34:-1:-1"),  # Java MessageIdImpl
        ("12:34:2:5", "12:34:2:5"),  # Java BatchMessageIdImpl
        (" (12, 34, 2, 5) ", "12:34:2:5"),
        ("3:17", "3:17"),  # a Kafka partition:offset
        ("abc", None),
        ("1:2:3:4:5", None),
        ("", None),
        (None, None),
    ],
)
def test_message_ids_of_every_client_compare_equal(raw, canonical):
    assert canonical_message_id(raw) == canonical


def test_origin_identity_ignores_spelling_qualification_and_partition_suffix():
    a = origin_identity("persistent://public/default/orders-partition-0", "(5,6,0,-1)")
    assert a == origin_identity("orders", "5:6:0")
    assert a == "persistent://public/default/orders|5:6:0:-1"
    assert origin_identity("orders", "5:7:0") != a
    assert origin_identity("payments", "5:6:0") != a
    assert origin_identity("orders", None) is None
    assert origin_identity("not a topic", "5:6:0") is None
    assert origin_identity(None, "5:6:0") is None


def test_claims_agree_or_conflict():
    same = origin_claims(
        {"REAL_TOPIC": "persistent://public/default/orders-partition-2", "__dlq.errors.topic": "orders"}
    )
    assert [c.key for c in same] == ["__dlq.errors.topic", "REAL_TOPIC"]
    assert conflicting_claims(same) == ()
    clash = origin_claims(
        {"REAL_TOPIC": "orders", "__dlq.errors.topic": "payments", "ORIGIN_MESSAGE_ID": "1:2:-1"}
    )
    assert [(c.key, c.topic) for c in conflicting_claims(clash)] == [
        ("__dlq.errors.topic", "payments"),
        ("REAL_TOPIC", "orders"),
    ]
    assert resolve_claims(clash, ["REAL_TOPIC"]).message_id == "1:2:-1"
    assert resolve_claims(clash, ["kafka_dlt-original-topic"]) is None
    junk = origin_claims({"REAL_TOPIC": "orders", "__connect.errors.topic": "not a topic"})
    assert len(conflicting_claims(junk)) == 2
    huge = origin_claims({"REAL_TOPIC": "x" * 100_000})
    assert len(huge[0].topic) < 400


def test_copies_of_one_original_in_different_conventions_share_a_replay_id():
    batch = snapshot_batch(
        [
            # Our library (Python MessageId spelling, partition topic).
            (b"a", ours("E", "m", origin=ORDERS + "-partition-0", ORIGIN_MESSAGE_ID="(5,6,0,-1)")),
            # The Java client's DLQ policy (Java spelling, short-form batch-less id).
            (b"a", {"REAL_TOPIC": ORDERS + "-partition-0", "ORIGIN_MESSAGE_ID": "5:6:0"}),
            # Another original.
            (b"a", {"REAL_TOPIC": ORDERS + "-partition-0", "ORIGIN_MESSAGE_ID": "5:7:0"}),
            # No origin id: the DLQ message's own identity.
            (b"a", {"REAL_TOPIC": ORDERS}),
        ]
    )
    rows = normalize_batch(batch).to_pylist()
    assert rows[0]["replay_id"] == rows[1]["replay_id"]
    assert len({r["replay_id"] for r in rows}) == 3


def test_conflicting_origins_are_parked_with_both_names_unless_the_playbook_decides():
    props = {
        "REAL_TOPIC": "persistent://public/default/payments",
        "ORIGIN_MESSAGE_ID": "1:2:-1:-1",
        "__dlq.errors.topic": ORDERS,
        "__dlq.errors.message.id": "(3,4,-1,-1)",
        "__dlq.errors.reason": "term",
        "__dlq.errors.exception.class": "E",
    }
    batch = snapshot_batch([(b"x", props)])
    columns = normalize_columns(batch)
    assert columns[ORIGIN_CONFLICT].to_pylist() == [
        f"__dlq.errors.topic={ORDERS!r}, REAL_TOPIC='persistent://public/default/payments'"
    ]
    out = by_key(decide_batch(scoped(normalize_batch(batch)), REPLAY_ALL, SETTINGS))["k0"]
    assert out["outcome"] == oc.ORIGIN_CONFLICT
    assert "persistent://public/default/payments" in out["outcome_reason"]
    assert ORDERS in out["outcome_reason"]
    assert "origin_precedence" in out["outcome_reason"]
    assert out["target_topic"] is None
    # The playbook says REAL_TOPIC wins: its topic and its message id are the origin.
    pb = parse_playbook("origin_precedence: [REAL_TOPIC]\nrules: [{name: all, action: republish}]")
    columns = normalize_columns(batch, pb.origin_precedence)
    assert columns[ORIGIN_CONFLICT].to_pylist() == [None]
    assert columns["origin_topic"].to_pylist() == ["persistent://public/default/payments"]
    assert columns["origin_message_id"].to_pylist() == ["1:2:-1:-1"]
    decided = decide_batch(scoped(normalize_batch(batch, columns)), pb, SETTINGS, columns=columns)
    out = by_key(decided)["k0"]
    assert out["outcome"] == oc.TO_REPUBLISH
    assert out["target_topic"] == "persistent://public/default/payments"


def test_parked_messages_say_precisely_why():
    rows = [
        (b"x", {UNDECODABLE_PROPERTY: "properties or key are not valid UTF-8"}),  # k0
        (b"x", {"app": "orders"}),  # k1
        (b"x", ours("E", "m", REPLAY_COUNT="three")),  # k2
        (b"x", ours("E", "m", origin="")),  # k3: no origin at all
        (b"x", ours("E", "m", origin="not a topic")),  # k4
        (b"x", ours("E", "m", origin="persistent://evil/ns/orders")),  # k5
        (b"x", {"REAL_TOPIC": "orders", "__connect.errors.topic": "payments"}),  # k6
    ]
    out = by_key(decide_batch(scoped(normalize_batch(snapshot_batch(rows))), REPLAY_ALL, SETTINGS))
    reasons = {k: (v["outcome"], v["outcome_reason"]) for k, v in out.items()}
    assert reasons["k0"][0] == oc.MALFORMED
    assert "not valid UTF-8" in reasons["k0"][1]
    assert "no known DLQ property convention" not in reasons["k0"][1]
    assert reasons["k1"] == (oc.MALFORMED, reasons["k1"][1])
    assert "none of REAL_TOPIC, ORIGIN_MESSAGE_ID" in reasons["k1"][1]
    assert reasons["k2"] == (oc.MALFORMED, "REPLAY_COUNT property 'three' is not a non-negative integer")
    assert reasons["k3"] == (oc.ORIGIN_REFUSED, "the error context names no origin topic")
    assert reasons["k4"] == (oc.ORIGIN_REFUSED, "origin topic 'not a topic' is not a valid topic name")
    assert reasons["k5"] == (
        oc.ORIGIN_REFUSED,
        "origin topic 'persistent://evil/ns/orders' is not in --origin-allowlist",
    )
    assert reasons["k6"][0] == oc.ORIGIN_CONFLICT


def test_duplicates_are_final_with_the_reason_and_never_sent():
    rows = [(b"x", ours("E", "m")), (b"x", ours("E", "m"))]
    batch = normalize_batch(snapshot_batch(rows))
    n = batch.num_rows
    import pyarrow as pa

    marked = batch.append_column("scope", pa.array(["in", "duplicate"][:n], pa.string())).append_column(
        "scope_reason",
        pa.array([None, f"another copy of the same original ({DLQ} 1:0:-1:-1) ..."], pa.string()),
    )
    out = by_key(decide_batch(marked, REPLAY_ALL, SETTINGS))
    assert out["k0"]["outcome"] == oc.TO_REPUBLISH
    assert out["k1"]["outcome"] == oc.DUPLICATE
    assert out["k1"]["outcome_reason"].startswith("another copy of the same original")
    assert out["k1"]["out_value"] is None
    assert oc.DUPLICATE in oc.FINAL_OUTCOMES
    assert oc.ORIGIN_CONFLICT not in oc.FINAL_OUTCOMES


def test_failure_reason_separates_signatures_of_retry_and_redelivery_dlqs():
    retry = {"REAL_TOPIC": ORDERS, "RETRY_TOPIC": ORDERS + "-RETRY", "RECONSUMETIMES": "16"}
    policy = {"REAL_TOPIC": ORDERS, "ORIGIN_MESSAGE_ID": "1:1:-1:-1"}
    tdmq = {"RETRY_TOPIC": ORDERS + "-RETRY", "RECONSUMETIMES": "3", "REAL_TOPIC": ORDERS, "DELAY_TIME": "5"}
    rows = normalize_batch(snapshot_batch([(b"x", retry), (b"x", policy), (b"x", tdmq)])).to_pylist()
    assert [r["reason"] for r in rows] == ["max-reconsumes", "max-redeliveries", "max-reconsumes"]
    assert rows[0]["signature"] != rows[1]["signature"]
    assert rows[0]["signature"] == rows[2]["signature"]


def test_replay_ids_from_the_origin_properties_alone_equal_those_of_the_whole_context():
    """decide computes replay ids on the origin properties only (no payload, no stack traces): they
    must be exactly the ids normalise computes from every property."""
    from pulsar_dlq_consumer.conventions import ORIGIN_PROPERTY_KEYS
    from spark_apps.dlq_replay.normalize import replay_ids

    shapes = [
        ours("E", "m"),
        ours("E", "m", origin=ORDERS + "-partition-1", ORIGIN_MESSAGE_ID="(5,6,1,-1)"),
        {"REAL_TOPIC": ORDERS, "ORIGIN_MESSAGE_ID": "5:6:-1"},
        {"REAL_TOPIC": ORDERS, "ORIGIN_MESSAGE_IDY_TIME": "5:7:-1"},
        {"__dlq.errors.topic": "orders", "__dlq.errors.partition": "2", "__dlq.errors.offset": "9"},
        {"__connect.errors.topic": "orders", "__connect.errors.partition": "1",
         "__connect.errors.offset": "3"},
        {"kafka_dlt-original-topic": "orders", "kafka_dlt-original-partition": "\x00\x00\x00\x01",
         "kafka_dlt-original-offset": "\x00\x00\x00\x00\x00\x00\x00\x07"},
        {"REAL_TOPIC": ORDERS, "__dlq.errors.topic": "payments", "ORIGIN_MESSAGE_ID": "1:1:-1"},
        {"REAL_TOPIC": "not a topic", "ORIGIN_MESSAGE_ID": "1:1:-1"},
        {"app": "x"},
        {},
    ]  # fmt: skip
    batch = snapshot_batch([(b"x", props) for props in shapes])
    expected = normalize_columns(batch)["replay_id"].to_pylist()
    origin_only = [{k: v for k, v in props.items() if k in ORIGIN_PROPERTY_KEYS} for props in shapes]
    alone = snapshot_batch([(b"x", props) for props in origin_only])
    assert replay_ids(alone) == expected
    precedence = ("__dlq.errors.topic",)
    assert replay_ids(alone, precedence) == normalize_columns(batch, precedence)["replay_id"].to_pylist()


def test_numbers_too_large_for_their_column_are_null_and_the_message_is_still_decided():
    huge = {
        "__dlq.errors.delivery.count": "99999999999",  # over 2^31 - 1: the column is 32-bit
        "RECONSUMETIMES": "2147483648",
        "__dlq.errors.failed.at": "9999999999999999999",  # over 2^63 - 1
    }
    rows = [(b"x", ours("E", "m", **huge)), (b"x", ours("E", "m", RECONSUMETIMES="2147483647"))]
    normalized = normalize_batch(snapshot_batch(rows))
    context = normalized.select(["delivery_count", "reconsume_times", "failed_at"]).to_pylist()
    assert context == [
        {"delivery_count": None, "reconsume_times": None, "failed_at": None},
        {"delivery_count": None, "reconsume_times": 2147483647, "failed_at": None},
    ]
    out = by_key(decide_batch(scoped(normalized), REPLAY_ALL, SETTINGS))
    assert [out[k]["outcome"] for k in ("k0", "k1")] == [oc.TO_REPUBLISH, oc.TO_REPUBLISH]
