"""Progress of a running step, logged every few seconds: messages done / total, rate, ETA, tasks.

A driver thread samples Spark's status while a step runs. The step's jobs are tagged with a job group
(``dlq-replay:<step>``), so the sample covers exactly that step's stages, whatever they do: tasks come
from ``SparkContext.statusTracker()``, and records from the stages' live metrics (records read, plus
shuffle records read), which executors report with every heartbeat. The step's total is what the run
already knows (the snapshot's size for decide and record, the messages to send for apply) or, for the
snapshot, the backlog the caller expects (``spark.dlq.progress.expectedMessages``); without a total the
line says how many were done and the ETA comes from the share of tasks done. Steps whose Python tasks
write their own files (:mod:`~spark_apps.dlq_replay.task_parquet`) send Spark only a tally row per
batch, so there the rows come from the tasks' progress files instead (:meth:`StepProgress.count_files`).

Nothing here touches the data plane: any step, however it reads or writes, gets the same lines.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import SparkSession

log = logging.getLogger("spark_apps.dlq_replay")

CONF_INTERVAL = "spark.dlq.progress.intervalSeconds"
CONF_EXPECTED = "spark.dlq.progress.expectedMessages"
#: Steps whose row counts are messages (the others log tasks only).
MESSAGE_STEPS = frozenset({"snapshot", "decide", "apply", "record"})
DEFAULT_INTERVAL = 10.0
JOB_GROUP_PREFIX = "dlq-replay:"


class _Waits:
    """Deliberate waits of the running step (e.g. the canary watch): the progress lines say what the
    step waits for instead of an ETA, and the rate and ETA leave the waited time out."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.current: tuple[str, float, float] | None = None  # (reason, started, until), monotonic
        self.done: list[tuple[float, float]] = []  # (started, ended) of finished waits

    def waited_since(self, since: float, now: float) -> float:
        """Seconds spent waiting between ``since`` and ``now``."""
        with self.lock:
            spans = list(self.done) + ([(self.current[1], now)] if self.current else [])
        return sum(max(0.0, min(end, now) - max(start, since)) for start, end in spans)


WAITS = _Waits()


class waiting:
    """Mark a deliberate wait of ``seconds`` for ``reason`` in the running step's progress lines."""

    def __init__(self, reason: str, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.reason, self.seconds, self.clock = reason, seconds, clock

    def __enter__(self) -> waiting:
        now = self.clock()
        with WAITS.lock:
            WAITS.current = (self.reason, now, now + self.seconds)
        return self

    def __exit__(self, *exc: object) -> None:
        with WAITS.lock:
            if WAITS.current is not None:
                WAITS.done.append((WAITS.current[1], self.clock()))
            WAITS.current = None


def wait_line(step: str, reason: str, left: float, elapsed: float) -> str:
    """``step apply: waiting for the canary watch, 40s left (no ETA while waiting), 1m10s elapsed``."""
    return (
        f"step {step}: waiting for the {reason}, {_duration(max(0.0, left))} left (no ETA while waiting), "
        f"{_duration(elapsed)} elapsed"
    )


@dataclass(frozen=True)
class Sample:
    """What Spark reports for one step at one moment."""

    tasks_total: int = 0
    tasks_done: int = 0
    tasks_running: int = 0
    records: int | None = None  # None: the metrics could not be read


def _duration(value: float) -> str:
    seconds = max(0, round(value))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def progress_line(
    step: str, sample: Sample, total: int | None, elapsed: float, unit: str = "messages"
) -> str:
    """``step decide: 12,000/50,000 messages (24%), 4,000/s, ETA 10s; tasks 1/4 done, 2 running``."""
    parts: list[str] = []
    done = sample.records
    eta: float | None = None
    if done is not None:
        done = min(done, total) if total is not None else done
        rate = done / elapsed if elapsed > 0 else 0.0
        if total:
            parts.append(f"{done:,}/{total:,} {unit} ({100 * done / total:.0f}%)")
        else:
            parts.append(f"{done:,} {unit} so far")
        parts.append(f"{rate:,.0f}/s" if rate >= 10 else f"{rate:.1f}/s")
        if total is not None and rate > 0:
            eta = (total - done) / rate
    if eta is None and sample.tasks_total and sample.tasks_done:
        eta = elapsed * (sample.tasks_total - sample.tasks_done) / sample.tasks_done
    if eta is not None:
        parts.append(f"ETA {_duration(eta)}")
    tasks = f"tasks {sample.tasks_done}/{sample.tasks_total} done, {sample.tasks_running} running"
    return f"step {step}: {', '.join(parts) + '; ' if parts else ''}{tasks}, {_duration(elapsed)} elapsed"


def expected_total(state: Any, step: str, expected_snapshot: int | None = None) -> int | None:
    """The messages a step handles, from what earlier steps recorded in the run state."""

    def info(name: str) -> dict[str, Any]:
        try:
            return dict(state.info(name) or {})
        except Exception:  # a state without that step
            return {}

    if step == "snapshot":
        return expected_snapshot
    if step in ("decide", "record"):
        value = info("snapshot").get("messages")
    elif step == "apply":
        value = info("decide").get("to_republish")
    else:
        value = None
    return int(value) if isinstance(value, int) else None


#: A plan node runs Python (a Python data source, mapInArrow, applyInArrow ...) when it has this metric.
_PYTHON_METRIC = "data returned from Python workers"
_ROWS_METRIC = "number of output rows"


def _count(text: str | None) -> int | None:
    """``"151,552"`` -> 151552; ``None`` for anything else (timings, sizes, summaries)."""
    if not text:
        return None
    digits = text.strip().replace(",", "")
    return int(digits) if digits.isdigit() else None


def rows_from_plan(nodes: list[tuple[str, dict[str, str | None]]]) -> int | None:
    """Rows the step's work has produced so far, from one query's plan nodes (top-down order).

    The step's work is its last Python node (reading Pulsar, deciding, sending); a query without one
    counts the rows of its topmost node that reports them, scans included. The write command at the top
    is skipped: it reports only when it finishes.
    """
    python = [metrics for name, metrics in nodes if _PYTHON_METRIC in metrics]
    others = [metrics for name, metrics in nodes if not name.startswith("Execute")]
    for metrics in python or others:
        rows = _count(metrics.get(_ROWS_METRIC))
        if rows is not None:
            return rows
    return None


class SparkStatus:
    """Reads tasks (status tracker) and live row counts (SQL metrics, updated by executor heartbeats) of
    the queries a step runs."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.context = spark.sparkContext
        self.first_execution = self.last_execution_id() + 1

    def _store(self) -> Any:
        return self.spark._jsparkSession.sharedState().statusStore()

    def last_execution_id(self) -> int:
        try:
            executions = self._store().executionsList()
            size = executions.size()
            return max((int(executions.apply(i).executionId()) for i in range(size)), default=-1)
        except Exception:
            return -1

    def mark(self) -> None:
        """Count only the queries that start from now on (call when a step starts)."""
        self.first_execution = self.last_execution_id() + 1

    def sample(self, group: str) -> Sample:
        tracker = self.context.statusTracker()
        stage_ids: set[int] = set()
        for job_id in tracker.getJobIdsForGroup(group):
            job = tracker.getJobInfo(job_id)
            if job is not None:
                stage_ids.update(job.stageIds)
        total = done = running = 0
        for stage_id in stage_ids:
            stage = tracker.getStageInfo(stage_id)
            if stage is None:
                continue
            total += stage.numTasks
            done += stage.numCompletedTasks
            running += stage.numActiveTasks
        return Sample(total, done, running, self.rows())

    def rows(self) -> int | None:
        """The most rows any of the step's queries has produced so far (its main pass), or ``None``."""
        try:
            store = self._store()
            executions = store.executionsList()
            best: int | None = None
            for i in range(executions.size()):
                execution_id = int(executions.apply(i).executionId())
                if execution_id < self.first_execution:
                    continue
                values = store.executionMetrics(execution_id)
                graph = store.planGraph(execution_id).allNodes()
                nodes = []
                for j in range(graph.size()):
                    node = graph.apply(j)
                    metrics: dict[str, str | None] = {}
                    declared = node.metrics()
                    for k in range(declared.size()):
                        metric = declared.apply(k)
                        value = values.get(metric.accumulatorId())
                        metrics[str(metric.name())] = str(value.get()) if value.isDefined() else None
                    nodes.append((str(node.name()), metrics))
                rows = rows_from_plan(nodes)
                if rows is not None:
                    best = rows if best is None else max(best, rows)
            return best
        except Exception:
            return None


class StepProgress:
    """Logs a progress line every ``interval`` seconds while a step runs (``start``/``stop``).

    ``sampler`` and ``clock`` are injectable for tests; by default the sample comes from
    :class:`SparkStatus` for the step's job group.
    """

    def __init__(
        self,
        spark: SparkSession | None,
        *,
        interval: float | None = None,
        sampler: Callable[[str], Sample] | None = None,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger = log,
    ) -> None:
        self.spark = spark
        if interval is None:
            interval = DEFAULT_INTERVAL
            if spark is not None:
                interval = float(spark.conf.get(CONF_INTERVAL, None) or DEFAULT_INTERVAL)
        self.interval = max(0.05, float(interval))
        self._status = SparkStatus(spark) if spark is not None and sampler is None else None
        self._sampler = sampler or (self._status.sample if self._status is not None else (lambda _: Sample()))
        self.clock = clock
        self.log = logger
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._folders: list[str] = []
        self.lines: list[str] = []

    def count_files(self, path: str) -> None:
        """Count the running step's messages from the rows its tasks have written to ``path`` (task
        writes; more than one path: their sum), not from Spark's metrics."""
        self._folders.append(path)

    def _file_rows(self) -> int:
        from spark_apps.dlq_replay.task_parquet import rows_written

        return sum(rows_written(path) or 0 for path in list(self._folders))

    def expected_snapshot(self) -> int | None:
        """The backlog the caller expects the snapshot to read (``spark.dlq.progress.expectedMessages``)."""
        if self.spark is None:
            return None
        text = str(self.spark.conf.get(CONF_EXPECTED, "") or "").strip()
        return int(text) if text.isdigit() else None

    def start(self, step: str, total: int | None, *, count_rows: bool = True) -> None:
        """Tag the step's jobs and log its progress until :meth:`stop` (tasks only without
        ``count_rows``: for steps whose rows are not messages)."""
        self.stop()
        self._folders = []
        group = JOB_GROUP_PREFIX + step
        if self._status is not None:
            self._status.mark()
        if self.spark is not None:
            self.spark.sparkContext.setJobGroup(group, f"DLQ replay step {step}", interruptOnCancel=False)
        self._stop = threading.Event()
        started = self.clock()
        stop = self._stop

        def run() -> None:
            failures = 0
            while failures < 3 and not stop.wait(self.interval):
                try:
                    sample = self._sampler(group)
                    records = sample.records
                    if not count_rows:
                        records = None
                    elif self._folders:  # the tasks write their own files: count their rows
                        records = self._file_rows()
                    sample = Sample(sample.tasks_total, sample.tasks_done, sample.tasks_running, records)
                    now = self.clock()
                    current = WAITS.current
                    if current is not None:
                        line = wait_line(step, current[0], current[2] - now, now - started)
                    else:  # the rate and ETA leave deliberate waits out
                        active = now - started - WAITS.waited_since(started, now)
                        line = progress_line(step, sample, total, max(active, 0.0))
                except Exception as exc:  # progress must never break a run; give up when Spark is gone
                    failures += 1
                    self.log.debug("progress of step %s unavailable: %s", step, exc)
                    continue
                failures = 0
                self.lines.append(line)
                self.log.info("%s", line)

        self._thread = threading.Thread(target=run, name=f"dlq-progress-{step}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop logging and untag the jobs (safe to call more than once)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout=5)
        if self.spark is not None:
            self.spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
            self.spark.sparkContext.setLocalProperty("spark.job.description", None)  # type: ignore[arg-type]
