"""``python -m bench.floors``: what the broker itself allows, for the replay's broker-bound steps.

On a fresh broker filled with the benchmark's workload, one to W spawned processes (each with its own
client, each on its share of the 4 DLQ topics) time three phases, each from the moment every process is
connected and ready:

- ``read``: Readers from the earliest message, nothing acked (the snapshot's reads in reader mode);
- ``read+ack``: Shared consumers with batch receive of 1,000, acking each message (a consumer-mode
  read; a consumer that does not ack stops at Apache Pulsar's 50,000 unacked messages);
- ``send``: the republished 80% as apply sends them (fixed payloads, the application's properties and
  the replay's lineage) to their origins, with batched ``send_async``, 10,000 pending, confirmed every
  1,000.

No parsing, no decisions, no Parquet: any replay that reads each DLQ message once and sends what it
republishes spends at least the read floor plus the send floor. The processes-2-over-1 ratio is how far
the broker-bound steps can scale with cores on this machine, where the broker shares them.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import queue
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

from bench import workload
from bench.brokers import BROKER_LABELS, BROKERS, fresh_broker
from bench.produce import prepare_and_produce
from bench.pulsar_io import BenchError, ConfirmedProducers, ReaderBatches, drain, make_client, subscribe
from bench.run import REPO_ROOT, parse_brokers, parse_sizes, stop_cleanly_on_sigterm

LOG = logging.getLogger("bench.floors")

PHASES = ("read", "read+ack", "send")
#: How long a phase may see nothing new before it fails.
IDLE_TIMEOUT_S = 60.0
#: Sends confirmed once per this many messages (the batch size of the copy contenders).
CONFIRM_EVERY = 1000
#: Tries of a phase on the same broker (pulsar-lite's Shared consumers stall now and then, see
#: ``bench.pulsar_io``); each try reads on a subscription of its own, from the earliest message.
ATTEMPTS = 2


@dataclass(frozen=True)
class Floor:
    """One timed phase: ``messages`` moved by ``processes`` processes in ``seconds`` (0 and an
    ``error`` when every try failed)."""

    broker: str
    size: int
    phase: str
    processes: int
    messages: int
    seconds: float
    error: str | None = None

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0


def shares(processes: int) -> list[list[str]]:
    """The DLQ topics of each process (the copy ceiling's split)."""
    topics = list(workload.DLQ_TOPICS)
    return [s for s in (topics[i::processes] for i in range(processes)) if s]


def _receive(client: Any, topics: list[str], n: int, subscription: str, ack: bool) -> int:
    """Receive every message of ``topics``: with Readers (``ack`` False), or on ``subscription`` (created
    here, from the earliest) acking each one. Returns how many (each once)."""
    backlog = workload.backlog_per_dlq(n)
    received = 0
    for topic in topics:
        source = subscribe(client, topic, subscription) if ack else ReaderBatches(client, topic)
        handle = _acker(source) if ack else _ignore
        received += drain(source, handle, expected=backlog[topic], idle_timeout_s=IDLE_TIMEOUT_S)
        source.close()
    return received


def _ignore(batch: list[Any]) -> None:
    """A read floor does nothing with what it reads."""


def _acker(consumer: Any) -> Callable[[list[Any]], None]:
    ack = consumer.acknowledge

    def handle(batch: list[Any]) -> None:
        for msg in batch:
            ack(msg)

    return handle


class _Send(NamedTuple):
    """One message to send, in the field order of :meth:`ConfirmedProducers.send_all`."""

    origin: str
    payload: bytes
    properties: dict[str, str]
    key: str
    event_timestamp: int


def republished(topics: list[str], n: int) -> list[_Send]:
    """The messages a replay republishes from ``topics``, as it sends them: fixed payload, the
    application's properties and the replay's lineage (built before the clock starts)."""
    import pyarrow as pa

    from bench.bench_fixes import fix_payload
    from spark_apps.dlq_replay.lineage import lineage_maps

    wanted = set(topics)
    chosen = [(i, workload.signature_of(i)) for i in range(n)]
    chosen = [(i, sig) for i, sig in chosen if sig.dlq in wanted and sig.action == workload.REPUBLISH]
    m = len(chosen)
    maps = lineage_maps(
        pa.array([list(workload.APP_PROPERTIES.items())] * m, pa.map_(pa.string(), pa.string())),
        pa.array([True] * m, pa.bool_()),
        pa.array([f"{i:016x}{i:016x}" for i, _ in chosen], pa.string()),
        "floors",
        pa.array([0] * m, pa.int64()),
        pa.array([sig.dlq for _, sig in chosen], pa.string()),
        pa.array(["bench_fixes:fix_order"] * m, pa.string()),
    ).to_pylist()
    return [
        _Send(
            sig.origin,
            fix_payload(workload.make_payload(i)),
            dict(props),
            f"order-{1_000_000 + i}",
            workload.EPOCH_MS + i,
        )
        for (i, sig), props in zip(chosen, maps, strict=True)
    ]


def _send(client: Any, messages: list[_Send]) -> int:
    """Send ``messages`` confirmed every :data:`CONFIRM_EVERY`; returns how many the broker confirmed."""
    producers = ConfirmedProducers(client, batch=CONFIRM_EVERY)
    producers.send_all(messages, confirm_every=CONFIRM_EVERY)
    producers.close()
    return producers.sent


def _worker(
    phase: str, service_url: str, topics: list[str], n: int, subscription: str, ready: Any, go: Any, out: Any
) -> None:
    """One process of a phase: connect and prepare, say ready, wait for go, run, answer its count."""
    try:
        messages = republished(topics, n) if phase == "send" else []
        client = make_client(service_url)
        try:
            ready.put(True)
            go.wait()
            if phase == "send":
                moved = _send(client, messages)
            else:
                moved = _receive(client, topics, n, subscription, ack=phase == "read+ack")
            out.put(("ok", moved))
        finally:
            client.close()
    except BaseException as exc:  # reported to the parent, which fails the phase
        ready.put(False)
        out.put(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        # The answers reach the parent first; then leave without finalisers (bench.exit.hard_exit).
        for channel in (ready, out):
            channel.close()
            channel.join_thread()
        from bench.exit import hard_exit

        hard_exit(0)


def time_phase(phase: str, service_url: str, n: int, processes: int, attempt: int = 1) -> tuple[int, float]:
    """Run ``phase`` in ``processes`` spawned processes; returns (messages, seconds from go to the last
    answer). Raises :class:`BenchError` when a process failed or moved a different count than expected."""
    ctx = multiprocessing.get_context("spawn")  # a pulsar client never crosses fork()
    ready, go, out = ctx.Queue(), ctx.Event(), ctx.Queue()
    parts = shares(processes)
    subscription = f"floor-{processes}-{attempt}"
    procs = [
        ctx.Process(target=_worker, args=(phase, service_url, part, n, subscription, ready, go, out))
        for part in parts
    ]
    for proc in procs:
        proc.start()
    try:
        for _ in procs:
            ready.get(timeout=600)
        started = time.perf_counter()
        go.set()
        answers = [out.get(timeout=3600) for _ in procs]
        seconds = time.perf_counter() - started
    except queue.Empty:
        raise BenchError(f"{phase} with {processes} processes: a process did not answer in time") from None
    finally:
        for proc in procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()
    errors = [str(body) for status, body in answers if status != "ok"]
    if errors:
        raise BenchError(f"{phase} with {processes} processes failed: " + "; ".join(errors))
    moved = sum(int(body) for _, body in answers)
    expected = workload.expected_counts(n).republish if phase == "send" else n
    if moved != expected:
        raise BenchError(f"{phase} with {processes} processes moved {moved} messages, expected {expected}")
    return moved, seconds


def measure(broker: str, n: int, processes: int, scratch: Path) -> list[Floor]:
    """Every phase on one fresh broker filled with ``n`` messages of the workload."""
    with fresh_broker(broker, scratch) as running:
        produced = prepare_and_produce(running.service_url, n)
        LOG.info("%s: %d messages produced in %.1f s", BROKER_LABELS[broker], n, produced.seconds)
        floors = []
        for phase in PHASES:
            for attempt in range(1, ATTEMPTS + 1):
                try:
                    moved, seconds = time_phase(phase, running.service_url, n, processes, attempt)
                except BenchError as exc:
                    LOG.warning("floor: %s, try %d of %d: %s", phase, attempt, ATTEMPTS, exc)
                    failed = Floor(broker, n, phase, processes, 0, 0.0, str(exc))
                    continue
                floors.append(Floor(broker, n, phase, processes, moved, round(seconds, 2)))
                break
            else:
                floors.append(failed)
            LOG.info("floor: %s", floors[-1])
        return floors


def floors_table(floors: list[Floor]) -> str:
    """Markdown: seconds and msgs/s per phase and process count, and the speed-up of the most processes
    over one."""
    counts = sorted({f.processes for f in floors})
    speed_up = len(counts) > 1 and counts[0] == 1
    head = "| broker | N | phase | " + " | ".join(f"{p} proc s (msgs/s)" for p in counts)
    lines = [head + (f" | {counts[-1]} over 1 |" if speed_up else " |")]
    lines.append("|" + "---|" * (lines[0].count("|") - 1))
    keys = sorted(
        {(f.broker, f.size, f.phase) for f in floors},
        key=lambda k: (BROKERS.index(k[0]), k[1], PHASES.index(k[2])),
    )
    by_key = {(f.broker, f.size, f.phase, f.processes): f for f in floors}
    for broker, size, phase in keys:
        cells = []
        for p in counts:
            f = by_key.get((broker, size, phase, p))
            cells.append(("FAILED" if f.error else f"{f.seconds:.2f} ({f.msgs_per_s:,.0f})") if f else "")
        row = f"| {BROKER_LABELS[broker]} | {size:,} | {phase} | " + " | ".join(cells)
        one, most = by_key.get((broker, size, phase, 1)), by_key.get((broker, size, phase, counts[-1]))
        if speed_up:
            if one and most and not one.error and not most.error:
                row += f" | {one.seconds / most.seconds:.2f} |"
            else:
                row += " | |"
        else:
            row += " |"
        lines.append(row)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.floors", description=__doc__, allow_abbrev=False)
    parser.add_argument("--sizes", type=parse_sizes, default=parse_sizes("1m"), help="default 1m")
    parser.add_argument("--brokers", type=parse_brokers, default=list(BROKERS))
    parser.add_argument(
        "--processes",
        type=lambda text: sorted({int(p) for p in text.split(",")}),
        default=[1, 2],
        help="comma-separated process counts (default 1,2)",
    )
    parser.add_argument("--results-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    parser.add_argument("--scratch-dir", type=Path, default=None)
    opts = parser.parse_args(argv)
    if not opts.processes or min(opts.processes) < 1:
        parser.error(f"--processes must be positive counts, got {opts.processes}")
    stop_cleanly_on_sigterm()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("bench.pulsar").setLevel(logging.WARNING)
    out_dir = opts.results_dir / ("floors-" + datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"))
    out_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="dlq-bench-floors-", dir=opts.scratch_dir))
    floors: list[Floor] = []
    try:
        for broker in opts.brokers:
            for n in opts.sizes:
                for processes in opts.processes:
                    floors.extend(measure(broker, n, processes, scratch))
                    (out_dir / "floors.json").write_text(
                        json.dumps([asdict(f) for f in floors], indent=2) + "\n"
                    )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    table = floors_table(floors)
    failed = [f for f in floors if f.error]
    (out_dir / "floors.md").write_text(table + "\n")
    print(table)
    for f in failed:
        print(
            f"FAILED: {BROKER_LABELS[f.broker]} {f.size:,} {f.phase} with {f.processes} processes: {f.error}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    from bench.exit import hard_exit

    hard_exit(main(sys.argv[1:]))
