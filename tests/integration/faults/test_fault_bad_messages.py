"""Fault suite, bad messages: one ``spark-submit`` replay over DLQs holding every kind of hostile or broken
message. The run must exit 0; each message ends with its expected outcome and a reason that says what was
wrong, parked ones stay pending, nothing is lost or doubled."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fault_support import CASES, FaultRow, end_state, finish, start
from fault_support import dlq_properties as ours  # our convention's context properties

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
PLAYBOOK = str(HERE / "fault_playbook.yaml")
ORDER = b'{"order_id": "ORD-1", "amount": 10}'
PENDING = (
    "skipped",
    "fix_failed",
    "malformed",
    "origin_refused",
    "origin_conflict",
    "filtered",
    "publish_failed",
)


@dataclass
class Case:
    """One kind of bad message: how to produce it, what it must become, what its reason must say."""

    fault: str
    outcome: str
    reason: str | None = None  # a fragment the ledger's outcome reason (or fix error) must contain
    messages: list[tuple[str, str, bytes, dict[str, Any]]] = field(default_factory=list)  # topic role, key
    batched: bool = False
    raw_key: bytes | None = None
    check: Callable[[dict[str, Any]], None] | None = None


def cases(orders: str, payments: str) -> dict[str, Case]:
    """Every case of ``CASES['bad-message']`` with its messages (keys are ``<case>-<i>``)."""
    n = iter(range(1, 10_000))

    def msg(case: str, i: int, payload: bytes, props: dict[str, Any], topic: str = "a") -> tuple:
        return (topic, f"{case}-{i}", payload, {**props, "fault-key": f"{case}-{i}"})

    c: dict[str, Case] = {}
    c["non-utf8-property"] = Case(
        "a property value that is not UTF-8", "malformed", "not valid UTF-8",
        [msg("non-utf8-property", 0, ORDER, ours(orders, "TimeoutError", "t", next(n), note=b"caf\xe9\xff"))],
    )  # fmt: skip
    c["non-utf8-key"] = Case(
        "a message key that is not UTF-8", "malformed", "not valid UTF-8",
        [msg("non-utf8-key", 0, ORDER, ours(orders, "TimeoutError", "t", next(n)))], raw_key=b"k\xff\xfe",
    )  # fmt: skip
    c["no-known-convention"] = Case(
        "properties in no DLQ convention", "malformed", "no known DLQ property convention",
        [msg("no-known-convention", 0, ORDER, {"app": "orders"})],
    )  # fmt: skip
    c["huge-error-message"] = Case(
        "a 100 KB exception message", "republished", None,
        [msg("huge-error-message", 0, ORDER, ours(orders, "TimeoutError", "slow " * 20_000, next(n)))],
    )  # fmt: skip
    c["huge-origin-topic"] = Case(
        "a 100 KB origin topic", "origin_refused", "is not a valid topic name",
        [msg("huge-origin-topic", 0, ORDER, ours(orders + "x" * 100_000, "TimeoutError", "t", next(n)))],
    )  # fmt: skip
    many = {f"app.p{i}": f"v{i}" for i in range(5000)}
    c["thousands-of-properties"] = Case(
        "5,000 properties", "skipped", "no playbook rule matched",
        [msg("thousands-of-properties", 0, ORDER, ours(orders, "RuntimeError", "x", next(n), **many))],
    )  # fmt: skip
    part3 = f"{orders}-partition-3"
    c["partition-suffixed-origin"] = Case(
        "an origin naming one partition (`-partition-3`)", "republished", None,
        [msg("partition-suffixed-origin", 0, ORDER, ours(part3, "TimeoutError", "t", next(n)))],
    )  # fmt: skip
    evil = "persistent://evil/ns/orders"
    c["foreign-tenant-origin"] = Case(
        "an origin in another tenant", "origin_refused", "is not in --origin-allowlist",
        [msg("foreign-tenant-origin", 0, ORDER, ours(evil, "TimeoutError", "t", next(n)))],
    )  # fmt: skip
    c["malformed-origin"] = Case(
        "an origin that is no topic name", "origin_refused", "is not a valid topic name",
        [msg("malformed-origin", 0, ORDER, ours("orders topic//", "TimeoutError", "t", next(n)))],
    )  # fmt: skip
    clash = {**ours(orders, "TimeoutError", "t", next(n)), "__dlq.errors.topic": payments}
    c["conflicting-origins"] = Case(
        "`REAL_TOPIC` and `__dlq.errors.topic` naming different topics", "origin_conflict", payments,
        [msg("conflicting-origins", 0, ORDER, clash)],
    )  # fmt: skip
    lots = ours(orders, "TimeoutError", "t", next(n), REPLAY_COUNT="lots")
    c["non-numeric-replay-count"] = Case(
        "`REPLAY_COUNT` = `lots`", "malformed", "REPLAY_COUNT property 'lots'",
        [msg("non-numeric-replay-count", 0, ORDER, lots)],
    )  # fmt: skip
    thrice = ours(orders, "TimeoutError", "t", next(n), REPLAY_COUNT="3")
    c["loop-guard-replay-count"] = Case(
        "a message replayed 3 times already", "loop_guarded", "loop guard",
        [msg("loop-guard-replay-count", 0, ORDER, thrice)],
    )  # fmt: skip
    twin = ours(orders, "TimeoutError", "t", next(n))
    c["duplicate-copy-other-dlq"] = Case(
        "two DLQ copies of one original, in two DLQ topics", "republished+duplicate", "another copy",
        [msg("duplicate-copy-other-dlq", i, ORDER, twin, role) for i, role in enumerate("ab")],
    )  # fmt: skip
    c["empty-payload"] = Case(
        "an empty payload for a JSON fix", "malformed", "found the record malformed",
        [msg("empty-payload", 0, b"", ours(orders, "ValueError", "missing currency", next(n)))],
    )  # fmt: skip
    c["payload-not-json"] = Case(
        "a payload that is not JSON for a JSON fix", "malformed", "found the record malformed",
        [msg("payload-not-json", 0, b"{not json", ours(orders, "ValueError", "missing currency", next(n)))],
    )  # fmt: skip
    big = b"<" * (3 * 1024 * 1024)
    c["multi-mib-payload"] = Case(
        "a 3 MiB payload", "archived", None,
        [msg("multi-mib-payload", 0, big, ours(orders, "JSONDecodeError", "", next(n)))],
    )  # fmt: skip

    def timeout(k: int) -> dict[str, Any]:
        return ours(orders, "TimeoutError", "", k)

    c["batched-entries"] = Case(
        "DLQ messages written in batches (10 per entry)", "republished", None,
        [msg("batched-entries", i, ORDER, timeout(900 + i), "batched") for i in range(10)],
        batched=True,
    )  # fmt: skip
    c["fix-raises"] = Case(
        "a fix that raises", "fix_failed", "RuntimeError: this fix always fails",
        [msg("fix-raises", 0, ORDER, ours(orders, "FixRaises", "x", next(n)))],
    )  # fmt: skip
    c["fix-hangs"] = Case(
        "a fix that hangs (sleeps 300 s; rule timeout 2 s)", "fix_failed", "FixTimeoutError",
        [msg("fix-hangs", 0, ORDER, ours(orders, "FixHangs", "x", next(n)))],
    )  # fmt: skip
    c["fix-wrong-type"] = Case(
        "a fix that returns an int", "fix_failed", "TypeError: a fix must return bytes",
        [msg("fix-wrong-type", 0, ORDER, ours(orders, "FixWrongType", "x", next(n)))],
    )  # fmt: skip
    c["fix-huge-payload"] = Case(
        "a fix that returns 6 MiB", "fix_failed", "maxMessageSize",
        [msg("fix-huge-payload", 0, ORDER, ours(orders, "FixHuge", "x", next(n)))],
    )  # fmt: skip
    # Between messages that are republished by the same producer: the refusal is that message's alone.
    c["fix-output-too-big-for-broker"] = Case(
        "a fix output under the fix limit whose properties take it past the broker's maxMessageSize",
        "publish_failed", "MessageTooBig",
        [msg("fix-output-too-big-for-broker", i, ORDER, ours(orders, "FixTooBigForBroker", "x", next(n)))
         for i in range(2)],
    )  # fmt: skip
    c.update(exiting_fixes(orders, n))
    assert tuple(c) == CASES["bad-message"]
    return c


def exiting_fixes(orders: str, n: Iterator[int]) -> dict[str, Case]:
    """Fixes that try to end the Spark Python worker: their messages are parked and the run goes on. Two
    messages each, two calls of the scalar fixes."""
    kinds = {
        "fix-calls-sys-exit": (
            "a fix that calls sys.exit(3) (its rule says on_fix_error: archive)", "FixExits", "sys.exit(3)"
        ),
        "fix-raises-keyboard-interrupt": (
            "a batch fix that raises KeyboardInterrupt", "FixInterrupts", "raised KeyboardInterrupt"
        ),
        "fix-calls-os-exit": (
            "a fix that calls os._exit(3)", "FixOsExits", "os._exit(3), which would end the Spark"
        ),
    }  # fmt: skip
    found: dict[str, Case] = {}
    for name, (fault, cls, reason) in kinds.items():
        keys = [f"{name}-{i}" for i in range(2)]
        messages = [("a", key, ORDER, {**ours(orders, cls, "x", next(n)), "fault-key": key}) for key in keys]
        found[name] = Case(fault, "fix_failed", reason, messages)
    return found


def summarize(outcomes: list[str]) -> str:
    """``republished x10`` for ten, ``republished, duplicate`` for two different ones."""
    if len(set(outcomes)) == 1 and len(outcomes) > 1:
        return f"{outcomes[0]} x{len(outcomes)}"
    return ", ".join(outcomes)


def produce(client: Any, topics: dict[str, str], all_cases: dict[str, Case]) -> dict[str, str]:
    """Send every case's messages (in case order); returns ``key -> expected outcome``."""
    import _pulsar

    producers = {
        role: client.create_producer(topic, batching_enabled=role == "batched", batching_max_messages=10)
        for role, topic in topics.items()
    }
    expected: dict[str, str] = {}
    for case in all_cases.values():
        for i, (role, key, payload, props) in enumerate(case.messages):
            if case.raw_key is not None:
                builder = _pulsar.MessageBuilder()
                builder.content(payload)
                builder.partition_key(case.raw_key)
                for k, v in props.items():
                    builder.property(k, v)
                producers[role]._producer.send(builder.build())
            elif case.batched:
                producers[role].send_async(payload, None, properties=props, partition_key=key)
            else:
                producers[role].send(payload, properties=props, partition_key=key)
            if case.outcome == "republished+duplicate":
                expected[key] = "republished" if i == 0 else "duplicate"
            else:
                expected[key] = case.outcome
        if case.batched:
            producers["batched"].flush()
    for producer in producers.values():
        producer.close()
    return expected


def test_every_kind_of_bad_message_is_parked_and_reported_or_handled(
    spark, pulsar_broker, pulsar_client, fault_bundle, fault_table, tmp_path
):
    u = uuid.uuid4().hex[:8]
    orders = f"persistent://public/default/orders-{u}"
    payments = f"persistent://public/default/payments-{u}"
    topics = {role: f"persistent://public/default/orders-{u}-{role}-DLQ" for role in ("a", "b", "batched")}
    all_cases = cases(orders, payments)
    expected = produce(pulsar_client, topics, all_cases)
    out = tmp_path / "out"
    argv = [
        "--run-id", "bad-messages", "--mode", "replay", "--service-url", pulsar_broker.service_url,
        "--topics", ",".join(topics.values()), "--output-dir", str(out), "--playbook", PLAYBOOK,
        "--origin-allowlist", "orders-*", "--idle-timeout-ms", "1500",
    ]  # fmt: skip
    summary = finish(start(fault_bundle, argv, tmp_path, "run"), tmp_path, "run")  # exit 0: never a crash
    assert summary["totals"]["snapshot"] == len(expected)

    snapshot = spark.read.parquet(str(out / "runs" / "bad-messages" / "snapshot"))
    keys = {
        (r["topic"], r["message_id_str"]): r["key"] or dict(r["properties"] or {}).get("fault-key")
        for r in snapshot.select("topic", "message_id_str", "key", "properties").collect()
    }
    ledger = spark.read.parquet(str(out / "ledger"))
    outcome_of: dict[str, dict[str, Any]] = {}
    for r in ledger.collect():
        outcome_of[keys[(r["dlq_topic"], r["dlq_message_id"])]] = r.asDict()
    assert sorted(outcome_of) == sorted(expected)  # one ledger row per message: none dropped
    archived = [r["key"] for r in spark.read.parquet(str(out / "archive")).select("key").collect()]
    state = end_state(
        pulsar_client, origin=orders, dlqs=list(topics.values()), expected=expected, archived_keys=archived
    )
    assert state.lost == 0, state.details
    assert state.misplaced == 0, state.details
    assert state.doubled == 0, state.details
    report = json.loads((out / "runs" / "bad-messages" / "report.json").read_text())
    assert all(len(g["template"]) <= 512 for g in report["groups"])

    for name, case in all_cases.items():
        case_keys = [m[1] for m in case.messages]
        got = [outcome_of[k]["outcome"] for k in case_keys]
        assert got == [expected[k] for k in case_keys], (name, [outcome_of[k] for k in case_keys])
        reasons = [
            (outcome_of[k]["outcome_reason"] or "") + " " + (outcome_of[k]["fix_error"] or "")
            for k in case_keys
        ]
        if case.reason is not None:
            assert any(case.reason in r for r in reasons), (name, reasons)
        assert all(len(r) < 2600 for r in reasons), name  # reasons stay bounded
        lost, doubled, pending = state.of(case_keys)
        assert pending == sum(expected[k] in PENDING for k in case_keys), name
        shown = next((r for r in reasons if r.strip()), "")
        fault_table.record(
            FaultRow(
                category="bad-message",
                case=name,
                fault=case.fault,
                expected=", ".join(sorted(set(expected[k] for k in case_keys))),
                result=f"{summarize(got)}: {shown.strip()[:140]}",
                lost=lost,
                doubled=doubled,
                pending=pending,
            )
        )
