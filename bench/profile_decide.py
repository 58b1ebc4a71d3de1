"""Per-message Python cost of the replay's decide step, without Spark or a broker.

``python -m bench.profile_decide [--n 10000] [--repeat 5] [--cprofile OUT]`` builds one Arrow batch of
``n`` snapshot rows from the benchmark workload (:mod:`bench.workload`) and times, in CPU microseconds
per message (the best of ``repeat`` passes, so other load on the machine matters little), what a decide
task does to it on an executor:

- ``identities``: each message's replay id (duplicate marking), as the snapshot's read tasks find it;
- ``normalise``: the error context parsed, template, signature, replay id and replay count;
- ``decide``: scope, playbook match, guards, lineage and the fix, with ``of which the fix`` (the
  playbook's ``bench_fixes:fix_order`` alone, JSON in and out) to separate our overhead from the user's
  code.

Spark runs these on every core; the step's wall time is roughly the sum times the messages divided by
the cores. ``--cprofile OUT`` writes a cProfile of one pass for ``python -m pstats OUT``.
"""

from __future__ import annotations

import argparse
import cProfile
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from bench import bench_fixes, workload
from bench.playbook import write_playbook


def snapshot_batch(n: int) -> pa.RecordBatch:
    """``n`` workload messages as one Arrow batch of the snapshot's schema, with empty scope marks."""
    from spark_apps.dlq_replay.schemas import SNAPSHOT_SCHEMA, arrow_schema
    from spark_apps.dlq_replay.scope import MARK, MARK_REASON

    now = datetime.now(UTC).replace(tzinfo=None)
    rows = [
        {
            "topic": m.dlq_topic,
            "partition": -1,
            "message_id": f"{m.index}".encode(),
            "message_id_str": f"{m.index}:0:-1",
            "key": m.partition_key,
            "value": m.payload,
            "properties": list(m.properties.items()),
            "publish_time": now,
            "redelivery_count": 0,
            "producer_name": "bench",
            "batch_size": 1,
        }
        for m in workload.generate(n)
    ]
    batch = pa.RecordBatch.from_pylist(rows, schema=arrow_schema(SNAPSHOT_SCHEMA))
    marks = pa.nulls(n, pa.string())
    return batch.append_column(MARK, marks).append_column(MARK_REASON, marks)


def phases(batch: pa.RecordBatch) -> dict[str, Callable[[], Any]]:
    """One callable per timed phase, each doing that phase to the whole batch."""
    from spark_apps.dlq_replay.decide import DecideSettings, ProducerSequencer, decide_batch
    from spark_apps.dlq_replay.fixes import FixRecord, load_fix, run_fix
    from spark_apps.dlq_replay.normalize import normalize_columns, replay_ids
    from spark_apps.dlq_replay.playbook import load_playbook
    from spark_apps.dlq_replay.scope import Filters, add_scope_columns
    from spark_apps.dlq_replay.topics import TopicMatcher

    # The playbook's fix module under the top-level name fix_files gives it on Spark.
    sys.modules.setdefault("bench_fixes", bench_fixes)
    with tempfile.TemporaryDirectory(prefix="profile-decide-") as tmp:
        playbook = load_playbook(str(write_playbook(Path(tmp) / "playbook.yaml")))
    settings = DecideSettings(
        run_id="profile", mode="replay", allowlist=TopicMatcher.parse([workload.ORIGIN_ALLOWLIST])
    )
    normalized = normalize_columns(batch)
    add_scope_columns(batch, normalized, Filters())
    fix_rule = next(rule for rule in playbook.rules if rule.fix)
    fix = load_fix(str(fix_rule.fix))
    records = [
        FixRecord(
            payload=value,
            key=None,
            ordering_key=None,
            properties={},
            event_time=None,
            context={},
            signature="",
            dlq_topic="",
            dlq_message_id="",
        )
        for value, properties in zip(
            batch.column("value").to_pylist(), batch.column("properties").to_pylist(), strict=True
        )
        if workload.decide(dict(properties)) == workload.REPUBLISH
    ]

    def decide() -> Any:
        columns = normalize_columns(batch)
        add_scope_columns(batch, columns, Filters())
        return decide_batch(batch, playbook, settings, ProducerSequencer("p", 0), columns)

    return {
        "identities": lambda: replay_ids(batch),
        "normalise": lambda: normalize_columns(batch),
        "decide": lambda: decide_batch(
            batch, playbook, settings, ProducerSequencer("p", 0), dict(normalized)
        ),
        "of which the fix": lambda: run_fix(fix, records, timeout_s=fix_rule.fix_timeout_seconds),
        "normalise + decide": decide,
    }


def measure(batch: pa.RecordBatch, repeat: int) -> dict[str, float]:
    """CPU microseconds per message of each phase, the best of ``repeat`` passes."""
    n = batch.num_rows
    out: dict[str, float] = {}
    for name, run in phases(batch).items():
        best = float("inf")
        for _ in range(repeat):
            start = time.process_time()
            run()
            best = min(best, time.process_time() - start)
        out[name] = best * 1e6 / n
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.profile_decide", description=__doc__, allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--n", type=int, default=10_000, help="messages in the batch (default 10000)")
    parser.add_argument("--repeat", type=int, default=5, help="passes per phase, best kept (default 5)")
    parser.add_argument("--cprofile", type=Path, help="write a cProfile of one decide pass here")
    args = parser.parse_args(argv)
    if args.n < 20 or args.repeat < 1:
        parser.error("--n must be at least 20 (one message per signature) and --repeat at least 1")
    batch = snapshot_batch(args.n)
    figures = measure(batch, args.repeat)
    print(f"decide step, CPU us per message ({args.n} messages, best of {args.repeat}):")
    for name, value in figures.items():
        print(f"  {name:<20} {value:8.1f}")
    if args.cprofile:
        cProfile.runctx("run()", {}, {"run": phases(batch)["normalise + decide"]}, str(args.cprofile))
        print(f"cProfile of one normalise + decide pass: python -m pstats {args.cprofile}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
