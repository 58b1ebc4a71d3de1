"""Normalise and decide on Arrow batches (pure functions, no Spark)."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay.context_columns import UNDECODABLE
from spark_apps.dlq_replay.decide import DecideSettings, decide_batch
from spark_apps.dlq_replay.normalize import normalize_columns
from spark_apps.dlq_replay.playbook import parse_playbook
from spark_apps.dlq_replay.schemas import NORMALIZED_SCHEMA, SNAPSHOT_SCHEMA, arrow_schema
from spark_apps.dlq_replay.signatures import replay_id
from spark_apps.dlq_replay.topics import TopicMatcher

DLQ = "persistent://public/default/orders-sub-DLQ"
ORDERS = "persistent://public/default/orders"
T0 = datetime(2024, 5, 1, tzinfo=UTC)


def ours(cls: str, message: str, origin: str = ORDERS, **extra: str) -> dict[str, str]:
    return {
        "REAL_TOPIC": origin,
        "ORIGIN_MESSAGE_ID": "5:6:-1:-1",
        "__dlq.errors.topic": origin,
        "__dlq.errors.reason": "term",
        "__dlq.errors.exception.class": cls,
        "__dlq.errors.exception.message": message,
        **extra,
    }


def snapshot_batch(rows: list[tuple[bytes, dict[str, str]]]) -> pa.RecordBatch:
    schema = arrow_schema(SNAPSHOT_SCHEMA)
    n = len(rows)
    data = {
        "topic": [DLQ] * n,
        "partition": [-1] * n,
        "message_id": [f"{i}".encode() for i in range(n)],
        "message_id_str": [f"1:{i}:-1:-1" for i in range(n)],
        "key": [f"k{i}" for i in range(n)],
        "ordering_key": [None] * n,
        "value": [r[0] for r in rows],
        "properties": [list(r[1].items()) for r in rows],
        "publish_time": [T0] * n,
        "event_time": [None] * n,
        "redelivery_count": [0] * n,
        "producer_name": ["p"] * n,
        "batch_size": [1] * n,
    }
    return pa.RecordBatch.from_arrays([pa.array(data[f.name], type=f.type) for f in schema], schema=schema)


def normalize_batch(batch: pa.RecordBatch, columns: dict[str, pa.Array] | None = None) -> pa.RecordBatch:
    """A batch of normalised rows (``NORMALIZED_SCHEMA``, the carried columns and ``normalize_columns``)
    and the ``UNDECODABLE`` flag the decide step reads."""
    computed = normalize_columns(batch) if columns is None else columns
    schema = arrow_schema(NORMALIZED_SCHEMA)
    arrays = [
        (batch.column(f.name) if f.name in SNAPSHOT_SCHEMA.names else computed[f.name]).cast(f.type)
        for f in schema
    ]
    normalized = pa.RecordBatch.from_arrays(arrays, schema=schema)
    return normalized.append_column(UNDECODABLE, computed[UNDECODABLE])


def scoped(batch: pa.RecordBatch, scopes: list[str] | None = None) -> pa.RecordBatch:
    n = batch.num_rows
    scopes = scopes or ["in"] * n
    reasons = [
        "not among the groups chosen for this run (--signatures)" if s == "filtered" else None for s in scopes
    ]
    return batch.append_column("scope", pa.array(scopes, pa.string())).append_column(
        "scope_reason", pa.array(reasons, pa.string())
    )


def by_key(batch: pa.RecordBatch) -> dict[str, dict]:
    return {row["key"]: row for row in batch.to_pylist()}


def test_normalize_every_row_kept_with_context_signature_and_ids():
    batch = snapshot_batch(
        [
            (b"{}", ours("ValueError", "bad order 1")),
            (b"{}", ours("ValueError", "bad order 2")),
            (b"{}", {"REAL_TOPIC": ORDERS, "ORIGIN_MESSAGE_ID": "1:2:-1:-1"}),
            (b"{}", {"__connect.errors.topic": "orders", "__connect.errors.exception.class.name": "E"}),
            (b"{}", {"foo": "bar"}),
            (b"{}", {}),
            (b"{}", {"REPLAY_COUNT": "nope", **ours("E", "m")}),
        ]
    )
    out = normalize_batch(batch)
    rows = out.to_pylist()
    assert out.num_rows == 7
    assert [r["context_format"] for r in rows] == [
        "ours",
        "ours",
        "pulsar_dlq_policy",
        "kafka_connect",
        "none",
        "none",
        "ours",
    ]
    assert rows[0]["signature"] == rows[1]["signature"]
    assert rows[0]["error_template"] == "bad order <num>"
    assert rows[4]["signature"] == rows[5]["signature"]  # unparseable context groups together
    assert rows[0]["dlq_topic"] == DLQ
    assert rows[0]["dlq_message_id"] == "1:0:-1:-1"
    # Rows 0, 1 and 6 carry the same origin (topic and ORIGIN_MESSAGE_ID): copies of one original share
    # one replay id. Rows without an origin message id fall back to the DLQ message's own identity.
    assert rows[0]["replay_id"] == rows[1]["replay_id"] == rows[6]["replay_id"]
    assert len({r["replay_id"] for r in rows}) == 5
    assert rows[4]["replay_id"] == replay_id(DLQ, "1:4:-1:-1")
    assert rows[0]["replay_count"] == 0
    assert rows[6]["replay_count"] is None
    assert rows[0]["value"] == b"{}"
    assert rows[0]["key"] == "k0"


@pytest.fixture
def fix_module(tmp_path, monkeypatch):
    (tmp_path / "unit_orders_fix.py").write_text(
        "import json\n"
        "def add_currency(r):\n"
        "    order = json.loads(r.payload)\n"
        "    if order.get('amount', 0) < 0:\n"
        "        raise ValueError('negative amount')\n"
        "    order.setdefault('currency', 'EUR')\n"
        "    props = dict(r.properties)\n"
        "    props['fixed'] = 'yes'\n"
        "    return json.dumps(order).encode(), props\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "unit_orders_fix"
    sys.modules.pop("unit_orders_fix", None)


PLAYBOOK = """
rules:
  - name: fix-currency
    match: {error_message: currency}
    action: republish
    fix: unit_orders_fix:add_currency
    fix_version: "1"
  - name: fix-or-archive
    match: {error_message: amount}
    action: republish
    fix: unit_orders_fix:add_currency
    fix_version: "1"
    on_fix_error: archive
  - name: as-is
    match: {error_class: Timeout}
    action: republish
  - name: poison
    match: {error_class: Poison}
    action: archive
  - name: junk
    match: {error_class: Junk}
    action: drop
"""


def test_decide_outcomes_fixes_guards_and_lineage(fix_module):
    rows = [
        (b'{"id": 1}', ours("ValueError", "missing currency", **{"tenant": "acme"})),  # k0 republish fixed
        (b'{"amount": -1}', ours("ValueError", "missing currency")),  # k1 fix_failed
        (b"not json", ours("ValueError", "missing currency")),  # k2 malformed (fix)
        (b'{"amount": -5}', ours("ValueError", "bad amount")),  # k3 archived on fix error
        (b"raw", ours("Timeout", "slow")),  # k4 republished as-is
        (b"raw", ours("Poison", "x")),  # k5 archived
        (b"raw", ours("Junk", "x")),  # k6 dropped
        (b"raw", ours("Other", "x")),  # k7 skipped (no rule)
        (b"raw", {"foo": "bar"}),  # k8 malformed (no context)
        (b"raw", ours("Timeout", "slow", REPLAY_COUNT="3")),  # k9 loop guard
        (b"raw", ours("Timeout", "slow", origin="persistent://public/default/admin")),  # k10 refused
        (b"raw", ours("Timeout", "slow", origin="bad topic name")),  # k11 refused (invalid)
        (b"raw", ours("Timeout", "slow", REPLAY_COUNT="x")),  # k12 malformed count
        (b"raw", ours("Timeout", "slow")),  # k13 filtered
        (b"raw", ours("Timeout", "slow")),  # k14 already final
        (b"raw", ours("Timeout", "slow", origin="persistent://public/default/orders-partition-1")),  # k15
        (b"raw", ours("Timeout", "slow", REPLAY_COUNT="2")),  # k16 just below the loop guard
    ]
    scopes = ["in"] * 13 + ["filtered", "already_final", "in", "in"]
    batch = scoped(normalize_batch(snapshot_batch(rows)), scopes)
    settings = DecideSettings(
        run_id="run-7",
        mode=oc.REPLAY,
        max_replays=3,
        allowlist=TopicMatcher.parse(["orders"]),
        archive_payload=True,
    )
    out = by_key(decide_batch(batch, parse_playbook(PLAYBOOK), settings))
    outcome = {k: v["outcome"] for k, v in out.items()}
    assert outcome == {
        "k0": oc.TO_REPUBLISH, "k1": oc.FIX_FAILED, "k2": oc.MALFORMED, "k3": oc.ARCHIVED,
        "k4": oc.TO_REPUBLISH, "k5": oc.ARCHIVED, "k6": oc.DROPPED, "k7": oc.SKIPPED, "k8": oc.MALFORMED,
        "k9": oc.LOOP_GUARDED, "k10": oc.ORIGIN_REFUSED, "k11": oc.ORIGIN_REFUSED, "k12": oc.MALFORMED,
        "k13": oc.FILTERED, "k14": oc.ALREADY_FINAL, "k15": oc.TO_REPUBLISH, "k16": oc.TO_REPUBLISH,
    }  # fmt: skip
    assert dict(out["k16"]["out_properties"])["REPLAY_COUNT"] == "3"
    k0 = out["k0"]
    assert k0["out_value"] == b'{"id": 1, "currency": "EUR"}'
    props = dict(k0["out_properties"])
    assert props["REPLAY_COUNT"] == "1"
    assert props["REPLAY_RUN_ID"] == "run-7"
    assert props["REPLAY_FIX"] == "unit_orders_fix:add_currency@1"
    assert props["REPLAYED_FROM"] == DLQ
    assert props["REPLAY_ID"] == k0["replay_id"]
    assert props["tenant"] == "acme"
    assert props["fixed"] == "yes"
    assert not any(k.startswith("__dlq.errors.") or k in ("REAL_TOPIC", "ORIGIN_MESSAGE_ID") for k in props)
    assert k0["target_topic"] == ORDERS
    assert k0["rule"] == "fix-currency"
    assert k0["action"] == "republish"
    assert k0["value"] is None  # the original payload is kept only for the archive
    assert out["k1"]["fix_error"] == "ValueError: negative amount"
    assert out["k2"]["fix_error"].startswith("json.decoder.JSONDecodeError")
    assert out["k3"]["value"] == b'{"amount": -5}'
    assert out["k3"]["archive_payload"] is True
    assert dict(out["k4"]["out_properties"])["REPLAY_FIX"] == ""
    assert out["k4"]["out_value"] == b"raw"
    assert "REPLAY_COUNT 3 >= --max-replays 3" in out["k9"]["outcome_reason"]
    assert out["k9"]["value"] == b"raw"
    assert out["k10"]["target_topic"] == "persistent://public/default/admin"
    assert "not in --origin-allowlist" in out["k10"]["outcome_reason"]
    assert out["k13"]["outcome_reason"] == "not among the groups chosen for this run (--signatures)"
    assert out["k15"]["target_topic"] == ORDERS
    assert out["k7"]["outcome_reason"] == "no playbook rule matched"


def test_archive_only_and_dry_run_without_allowlist():
    batch = scoped(
        normalize_batch(snapshot_batch([(b"r", ours("Timeout", "x")), (b"r", ours("Poison", "x"))]))
    )
    pb = parse_playbook(PLAYBOOK)
    out = by_key(decide_batch(batch, pb, DecideSettings("r", oc.ARCHIVE_ONLY, allowlist=None)))
    assert out["k0"]["outcome"] == oc.SKIPPED
    assert "archive-only" in out["k0"]["outcome_reason"]
    assert out["k1"]["outcome"] == oc.ARCHIVED
    out = by_key(decide_batch(batch, pb, DecideSettings("r", oc.DRY_RUN, allowlist=None)))
    assert out["k0"]["outcome"] == oc.ORIGIN_REFUSED
    assert "no --origin-allowlist" in out["k0"]["outcome_reason"]


def test_payload_off_by_rule_topic_and_run_default():
    pb = parse_playbook(
        "payload_off_topics: [orders]\nrules:\n"
        "  - {name: a, match: {error_class: A}, action: archive, archive_payload: false}\n"
        "  - {name: b, match: {error_class: B}, action: archive}\n"
    )
    rows = [
        (b"r", ours("A", "x", origin="persistent://public/default/other")),
        (b"r", ours("B", "x", origin="persistent://public/default/other")),
        (b"r", ours("B", "x")),
    ]
    batch = scoped(normalize_batch(snapshot_batch(rows)))
    out = by_key(decide_batch(batch, pb, DecideSettings("r", oc.REPLAY)))
    assert [out[k]["archive_payload"] for k in ("k0", "k1", "k2")] == [False, True, False]
    out = by_key(decide_batch(batch, pb, DecideSettings("r", oc.REPLAY, archive_payload=False)))
    assert out["k1"]["archive_payload"] is False


def test_sequencer_numbers_sends_per_target_across_batches():
    from pulsar_dlq_consumer.replay_lock import run_hash
    from spark_apps.dlq_replay.decide import ProducerSequencer

    pb = parse_playbook(PLAYBOOK)
    settings = DecideSettings("run-9", oc.REPLAY, allowlist=TopicMatcher.parse(["orders", "payments"]))
    payments = "persistent://public/default/payments"
    rows = [
        (b"r", ours("Timeout", "x")),
        (b"r", ours("Poison", "x")),  # archived: no producer
        (b"r", ours("Timeout", "x", origin=payments)),
        (b"r", ours("Timeout", "x")),
    ]
    batch = scoped(normalize_batch(snapshot_batch(rows)))
    sequencer = ProducerSequencer("run-9", bucket=1)
    first = by_key(decide_batch(batch, pb, settings, sequencer))
    second = by_key(decide_batch(batch, pb, settings, sequencer))  # the task's next batch
    names = {k: first[k]["replay_producer"] for k in first}
    assert names["k1"] is None
    assert first["k1"]["sequence_id"] is None
    assert names["k0"] == names["k3"] != names["k2"]
    assert names["k0"].startswith(f"dlq-replay-{run_hash('run-9')}-")
    assert names["k0"].endswith("-1")
    assert [first[k]["sequence_id"] for k in ("k0", "k3", "k2")] == [0, 1, 0]
    assert [second[k]["sequence_id"] for k in ("k0", "k3", "k2")] == [2, 3, 1]
    # Without a sequencer (dry-run tools, tests) the producer columns stay null.
    plain = by_key(decide_batch(batch, pb, settings))
    assert plain["k0"]["replay_producer"] is None
    assert plain["k0"]["sequence_id"] is None


def test_rows_decided_once_per_group_get_each_rows_own_decision(fix_module):
    """A batch is decided once per group of equal rows; every row still gets exactly the decision it gets
    alone: its own mark reason, REPLAY_COUNT, fix result, payload and properties."""
    rows = [
        (b'{"id": 1}', ours("ValueError", "missing currency", tenant="acme")),
        (b'{"id": 2}', ours("ValueError", "missing currency", tenant="other")),
        (b'{"amount": -1}', ours("ValueError", "missing currency")),
        (b"not json", ours("ValueError", "missing currency")),
        (b'{"amount": -5}', ours("ValueError", "bad amount")),
        (b"raw-1", ours("Timeout", "slow", tenant="a")),
        (b"raw-2", ours("Timeout", "slow", tenant="b")),
        (b"raw", ours("Poison", "x")),
        (b"raw", ours("Junk", "x")),
        (b"raw", ours("Timeout", "slow", REPLAY_COUNT="x")),
        (b"raw", ours("Timeout", "slow", REPLAY_COUNT="y")),
        (b"raw", ours("Timeout", "slow", REPLAY_COUNT="3")),
        (b"raw", ours("Timeout", "slow", REPLAY_COUNT="4")),
        (b"raw", ours("Timeout", "slow")),
        (b"raw", ours("Timeout", "slow")),
        (b"raw", ours("Timeout", "slow")),
    ] * 2
    scopes = (["in"] * 13 + ["filtered", "duplicate", "already_final"]) * 2
    batch = scoped(normalize_batch(snapshot_batch(rows)), scopes)
    reasons = [f"another copy ({i})" if s == "duplicate" else r for i, (s, r) in enumerate(
        zip(scopes, batch.column("scope_reason").to_pylist(), strict=True)
    )]  # fmt: skip
    batch = batch.set_column(batch.schema.get_field_index("scope_reason"), "scope_reason", pa.array(reasons))
    settings = DecideSettings(run_id="run-8", mode=oc.REPLAY, allowlist=TopicMatcher.parse(["orders"]))
    by_property = PLAYBOOK + "  - name: by-tenant\n    match: {properties: {tenant: a}}\n    action: drop\n"
    for playbook in (parse_playbook(PLAYBOOK), parse_playbook(by_property)):  # grouped, then row by row
        together = decide_batch(batch, playbook, settings).to_pylist()
        alone = [decide_batch(batch.slice(i, 1), playbook, settings).to_pylist()[0] for i in range(len(rows))]
        assert together == alone
    outcomes = [row["outcome"] for row in together]
    assert outcomes.count(oc.TO_REPUBLISH) == 8
    assert {together[i]["outcome_reason"] for i in (9, 10)} == {
        "REPLAY_COUNT property 'x' is not a non-negative integer",
        "REPLAY_COUNT property 'y' is not a non-negative integer",
    }
    assert together[14]["outcome_reason"] == "another copy (14)"


def test_a_fix_sees_each_rows_own_fields(tmp_path, monkeypatch):
    # The records' fields other than the payload are looked up in the batch on first use.
    (tmp_path / "unit_fields_fix.py").write_text(
        "import json\n"
        "def echo(r):\n"
        "    seen = [r.key, r.ordering_key, r.event_time and r.event_time.isoformat(), r.signature,\n"
        "            r.dlq_topic, r.dlq_message_id, r.properties.get('tenant'), r.context['error_class']]\n"
        "    return json.dumps(seen).encode()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    playbook = parse_playbook(
        "rules:\n  - name: echo\n    match: {error_class: E}\n    action: republish\n"
        "    fix: unit_fields_fix:echo\n    fix_version: '1'\n"
    )
    rows = [(b"{}", ours("E", f"m{i}", tenant=f"t{i}")) for i in range(3)]
    batch = snapshot_batch(rows)
    later = datetime(2024, 5, 2, tzinfo=UTC)
    batch = batch.set_column(
        batch.schema.get_field_index("event_time"),
        "event_time",
        pa.array([None, later, None], batch.schema.field("event_time").type),
    )
    settings = DecideSettings(run_id="r", mode=oc.REPLAY, allowlist=TopicMatcher.parse(["orders"]))
    try:
        out = by_key(decide_batch(scoped(normalize_batch(batch)), playbook, settings))
    finally:
        sys.modules.pop("unit_fields_fix", None)
    for i in range(3):
        row = out[f"k{i}"]
        assert row["outcome"] == oc.TO_REPUBLISH
        key, ordering, event, signature, dlq, dlq_id, tenant, error_class = json.loads(row["out_value"])
        assert (key, ordering, tenant, error_class) == (f"k{i}", None, f"t{i}", "E")
        assert event == (later.isoformat() if i == 1 else None)
        assert (signature, dlq, dlq_id) == (row["signature"], DLQ, row["dlq_message_id"])


def test_each_rule_keeps_its_own_fix_timeout(tmp_path, monkeypatch):
    # Two rules with one fix and different time limits: each row is held to its own rule's limit.
    slow = "import time\ndef slow(r):\n    time.sleep(0.3)\n    return r.payload\n"
    (tmp_path / "unit_slow_fix.py").write_text(slow)
    monkeypatch.syspath_prepend(str(tmp_path))
    rule = "    action: republish\n    fix: unit_slow_fix:slow\n    fix_version: '1'\n"
    playbook = parse_playbook(
        f"rules:\n  - name: patient\n    match: {{error_class: Patient}}\n{rule}    fix_timeout_seconds: 5\n"
        f"  - name: hasty\n    match: {{error_class: Hasty}}\n{rule}    fix_timeout_seconds: 0.1\n"
    )
    batch = snapshot_batch([(b"{}", ours("Patient", "a")), (b"{}", ours("Hasty", "b"))])
    settings = DecideSettings(run_id="r", mode=oc.REPLAY, allowlist=TopicMatcher.parse(["orders"]))
    try:
        out = by_key(decide_batch(scoped(normalize_batch(batch)), playbook, settings))
    finally:
        sys.modules.pop("unit_slow_fix", None)
    assert out["k0"]["outcome"] == oc.TO_REPUBLISH
    assert out["k1"]["outcome"] == oc.FIX_FAILED
    assert "fix_timeout_seconds (0.1 s)" in out["k1"]["fix_error"]
