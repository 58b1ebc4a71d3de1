"""Correctness checks run after every contender, so a fast wrong answer cannot pass.

Checks (untimed): exactly the expected messages on each origin topic (by ``event_id``, no duplicate,
none missing, payload fixed or unchanged as the contender promises, key and event time kept), the
archive holds exactly the archived messages, the ledger has one final row per DLQ message, and
nothing is left pending on the DLQ subscription.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import workload
from bench.bench_fixes import is_fixed
from bench.pulsar_io import BenchError, ReaderBatches, count_until_idle, drain, make_client, subscribe

if TYPE_CHECKING:
    from bench.output_root import OutputRoot

LOG = logging.getLogger("bench.verify")

#: Properties the replay app adds to a republished message (lineage).
LINEAGE_KEYS = ("REPLAY_ID", "REPLAY_RUN_ID", "REPLAY_COUNT", "REPLAYED_FROM")


@dataclass
class Verification:
    """What was checked and found; ``errors`` is empty when the run is correct."""

    checks: dict[str, object] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def expect(self, name: str, got: object, want: object) -> None:
        self.checks[name] = got
        if got != want:
            self.errors.append(f"{name}: got {got}, expected {want}")

    def raise_if_failed(self, contender: str) -> None:
        if self.errors:
            raise BenchError(f"{contender} produced a wrong result: " + "; ".join(self.errors))


def _expected_indices(n: int, action: str | None) -> set[int]:
    sigs = {s.index for s in workload.SIGNATURES if action is None or s.action == action}
    return {i for i in range(n) if i % workload.SIGNATURE_COUNT in sigs}


def verify_origins(service_url: str, n: int, *, mode: str, lineage: bool, result: Verification) -> None:
    """Read every origin topic through the verification subscription and check what arrived.

    ``mode`` is ``copy`` (every DLQ message, unchanged) or ``replay`` (only the republish signatures,
    fixed, without DLQ bookkeeping properties).
    """
    want = _expected_indices(n, None if mode == "copy" else workload.REPUBLISH)
    seen: Counter[int] = Counter()
    per_topic: Counter[str] = Counter()
    problems: Counter[str] = Counter()

    def handle(batch: list[Any]) -> None:
        for msg in batch:
            doc = json.loads(msg.data())
            index = int(doc["event_id"])
            seen[index] += 1
            per_topic[msg.topic_name()] += 1
            props = msg.properties()
            if msg.partition_key() != f"order-{1_000_000 + index}":
                problems["key not kept"] += 1
            if msg.event_timestamp() != workload.EPOCH_MS + index:
                problems["event time not kept"] += 1
            if props.get("tenant") != workload.APP_PROPERTIES["tenant"]:
                problems["application property lost"] += 1
            if workload.signature_of(index).origin != _base(msg.topic_name()):
                problems["sent to the wrong origin"] += 1
            if mode == "copy":
                if msg.data() != workload.make_payload(index):
                    problems["payload changed"] += 1
            else:
                if not is_fixed(doc):
                    problems["payload not fixed"] += 1
                if any(k.startswith("__dlq.errors.") or k == "REAL_TOPIC" for k in props):
                    problems["DLQ bookkeeping property kept"] += 1
                if lineage and any(k not in props for k in LINEAGE_KEYS):
                    problems["lineage property missing"] += 1

    want_per_topic = _per_origin(want)
    client = make_client(service_url)
    try:
        for topic in workload.ORIGIN_TOPICS:
            # The verification subscription retains what arrived; a Reader reads it all, every time
            # (a Shared consumer that acks nothing stops at 50,000 on Apache Pulsar: a 1M run's origins).
            reader = ReaderBatches(client, topic)
            # Fewer messages than expected is a wrong answer, reported by the counts below (not a crash).
            with contextlib.suppress(BenchError):
                drain(reader, handle, expected=want_per_topic[topic], idle_timeout_s=30.0, extra_wait_s=0.5)
            reader.close()
            if reader.redelivered:
                LOG.info("%s: the Reader delivered %d message ids again (dropped)", topic, reader.redelivered)
    finally:
        client.close()
    indices = set(seen)
    result.expect("origin.messages", sum(seen.values()), len(want))
    result.expect("origin.duplicates", sum(c - 1 for c in seen.values() if c > 1), 0)
    result.expect("origin.missing", len(want - indices), 0)
    result.expect("origin.unexpected", len(indices - want), 0)
    for problem, count in sorted(problems.items()):
        result.expect(f"origin.{problem}", count, 0)
    want_nonzero = {topic: count for topic, count in sorted(want_per_topic.items()) if count}
    result.expect("origin.per_topic", dict(sorted(per_topic.items())), want_nonzero)


def _per_origin(indices: set[int]) -> dict[str, int]:
    counts = dict.fromkeys(workload.ORIGIN_TOPICS, 0)
    per_sig = Counter(i % workload.SIGNATURE_COUNT for i in indices)
    for sig in workload.SIGNATURES:
        counts[sig.origin] += per_sig.get(sig.index, 0)
    return counts


def _base(topic: str) -> str:
    from pulsar_dlq_consumer.context import base_topic

    return base_topic(topic)


def verify_pending(service_url: str, result: Verification, *, idle_s: float = 2.0) -> None:
    """Nothing may be left unacked on the DLQ subscription: read every DLQ topic through it (without
    acking) until nothing arrives for ``idle_s``, and count what is still pending (at most 50,000 per
    topic on Apache Pulsar, whose Shared consumers stop there: enough to tell none from some)."""
    client = make_client(service_url)
    try:
        consumers = [subscribe(client, topic, workload.DLQ_SUBSCRIPTION) for topic in workload.DLQ_TOPICS]
        left = sum(count_until_idle(consumer, idle_s) for consumer in consumers)
        for consumer in consumers:
            consumer.close()
    finally:
        client.close()
    result.expect("dlq.left_pending", left, 0)


def verify_jsonl_archive(path: Path, n: int, result: Verification) -> None:
    """The hand-written contenders' archive: one JSON line per archived DLQ message."""
    want = _expected_indices(n, workload.ARCHIVE)
    seen: Counter[int] = Counter()
    if path.exists():
        with path.open(encoding="utf-8") as lines:
            for line in lines:
                seen[int(json.loads(json.loads(line)["payload"])["event_id"])] += 1
    result.expect("archive.rows", sum(seen.values()), len(want))
    result.expect("archive.exact", set(seen) == want and all(c == 1 for c in seen.values()), True)


def verify_app_outputs(report: dict[str, Any], n: int, result: Verification, output: OutputRoot) -> None:
    """The replay app's own record: report totals, and the archive and ledger rows read from ``output``
    (a local folder or the S3 server)."""
    expected = workload.expected_counts(n)
    totals = report.get("totals", {})
    result.expect("report.status", report.get("status"), "succeeded")
    result.expect("report.snapshot", totals.get("snapshot"), n)
    result.expect("report.republished", totals.get("republished"), expected.republish)
    result.expect("report.archived", totals.get("archived"), expected.archive)
    result.expect("report.acked", totals.get("acked"), n)
    result.expect("report.left_pending", totals.get("left_pending"), 0)
    paths = report.get("paths", {})
    run_id = report.get("run_id")
    for name, want in (("archive", expected.archive), ("ledger", n)):
        location = paths.get(name)
        if not location:
            result.errors.append(f"report.paths.{name} is missing")
            continue
        result.expect(f"{name}.rows", output.count_parquet_rows(location, run_id=run_id), want)


def groups_of(report: dict[str, Any]) -> Iterable[dict[str, Any]]:
    groups = report.get("groups", [])
    return groups if isinstance(groups, list) else []
