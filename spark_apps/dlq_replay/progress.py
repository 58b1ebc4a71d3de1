"""A running step's progress lines (done / total, rate, ETA) and its jobs' tag (``docs/report.md``)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from pulsar_dlq_consumer.replay_options import CONF_EXPECTED_MESSAGES
from spark_apps.dlq_replay.session import conf_value
from spark_apps.dlq_replay.task_parquet import rows_written

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from pyspark.sql import SparkSession

log = logging.getLogger("spark_apps.dlq_replay")

CONF_INTERVAL = "spark.dlq.progress.intervalSeconds"
#: Steps whose row counts are messages (the others log that they run).
MESSAGE_STEPS = frozenset({"snapshot", "decide", "apply", "record"})
DEFAULT_INTERVAL = 10.0


def step_tag(step: str) -> str:
    """The tag of step ``step``'s jobs (``dlq-replay:decide``)."""
    return f"dlq-replay:{step}"


class _Waits:
    """Deliberate waits of the running step (the canary watch), left out of the rate and ETA."""

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


@contextlib.contextmanager
def waiting(reason: str, seconds: float, clock: Callable[[], float] = time.monotonic) -> Iterator[None]:
    """Mark a deliberate wait of ``seconds`` for ``reason`` in the running step's progress lines."""
    started = clock()
    with WAITS.lock:
        WAITS.current = (reason, started, started + seconds)
    try:
        yield
    finally:
        with WAITS.lock:
            WAITS.done.append((started, clock()))
            WAITS.current = None


def wait_line(step: str, reason: str, left: float, elapsed: float) -> str:
    """``step apply: waiting for the canary watch, 40s left (no ETA while waiting), 1m10s elapsed``."""
    return (
        f"step {step}: waiting for the {reason}, {_duration(max(0.0, left))} left (no ETA while waiting), "
        f"{_duration(elapsed)} elapsed"
    )


def _duration(value: float) -> str:
    seconds = max(0, round(value))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def progress_line(step: str, done: int | None, total: int | None, elapsed: float) -> str:
    """``step decide: 12,000/50,000 messages (24%), 4,000/s, ETA 10s, 3s elapsed``."""
    if done is None:
        return f"step {step}: running, {_duration(elapsed)} elapsed"
    done = min(done, total) if total is not None else done
    rate = done / elapsed if elapsed > 0 else 0.0
    parts = [
        f"{done:,}/{total:,} messages ({100 * done / total:.0f}%)" if total else f"{done:,} messages so far"
    ]
    parts.append(f"{rate:,.0f}/s" if rate >= 10 else f"{rate:.1f}/s")
    if total is not None and rate > 0:
        parts.append(f"ETA {_duration((total - done) / rate)}")
    parts.append(f"{_duration(elapsed)} elapsed")
    return f"step {step}: {', '.join(parts)}"


def expected_total(state: Any, step: str, expected_snapshot: int | None = None) -> int | None:
    """The messages a step handles, from what earlier steps recorded in the run state."""
    if step == "snapshot":
        return expected_snapshot
    earlier, key = {"apply": ("decide", "to_republish")}.get(step, ("snapshot", "messages"))
    value = state.info(earlier).get(key) if step in ("decide", "record", "apply") else None
    return value if isinstance(value, int) else None


def files_rows(paths: Sequence[str]) -> int:
    """The rows the tasks have written to ``paths`` so far (a folder without a count yet counts 0)."""
    total = 0
    for path in paths:
        with contextlib.suppress(Exception):  # a file removed while read, a store that does not answer
            total += rows_written(path) or 0
    return total


class StepProgress:
    """Logs a progress line every ``interval`` seconds while a step runs, and tags the step's jobs."""

    def __init__(
        self,
        spark: SparkSession,
        *,
        interval: float | None = None,
        rows: Callable[[Sequence[str]], int | None] = files_rows,
    ) -> None:
        self.spark = spark
        self.interval = max(0.05, float(interval or conf_value(spark, CONF_INTERVAL) or DEFAULT_INTERVAL))
        self.rows = rows
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._folders: list[str] = []
        self._tags: list[str] = []
        self.lines: list[str] = []

    def count_files(self, path: str) -> None:
        """Count the running step's messages from the rows its tasks write to ``path`` (summed)."""
        self._folders.append(path)

    def expected_snapshot(self) -> int | None:
        """The backlog the caller expects the snapshot to read (``spark.dlq.progress.expectedMessages``)."""
        text = conf_value(self.spark, CONF_EXPECTED_MESSAGES)
        return int(text) if text and text.isdigit() else None

    def start(self, step: str, total: int | None) -> None:
        """Tag the step's jobs and log its progress (of messages in :data:`MESSAGE_STEPS`) until stopped."""
        self.stop()
        self._folders = []
        try:
            self.spark.addTag(step_tag(step))
            self._tags.append(step_tag(step))
        except Exception as exc:  # untagged jobs run all the same
            log.debug("could not tag step %s's jobs: %s", step, exc)
        self._stop = stop = threading.Event()
        started = time.monotonic()
        count_rows = step in MESSAGE_STEPS

        def run() -> None:
            failures = 0
            while failures < 3 and not stop.wait(self.interval):
                try:
                    done = self.rows(tuple(self._folders)) if count_rows and self._folders else None
                    now = time.monotonic()
                    current = WAITS.current
                    if current is not None:
                        line = wait_line(step, current[0], current[2] - now, now - started)
                    else:  # the rate and ETA leave deliberate waits out
                        active = now - started - WAITS.waited_since(started, now)
                        line = progress_line(step, done, total, max(active, 0.0))
                except Exception as exc:  # progress must never break a run; give up when it keeps failing
                    failures += 1
                    log.debug("progress of step %s unavailable: %s", step, exc)
                    continue
                failures = 0
                self.lines.append(line)
                log.info("%s", line)

        self._thread = threading.Thread(target=run, name=f"dlq-progress-{step}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop logging and untag the jobs (from the thread that called :meth:`start`)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join(timeout=5)
        tags, self._tags = self._tags, []
        for tag in tags:
            with contextlib.suppress(Exception):
                self.spark.removeTag(tag)
