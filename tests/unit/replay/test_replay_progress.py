"""Progress lines of long steps (pure parts: formatting, totals, the tasks' progress files, the thread)."""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace

from spark_apps.dlq_replay.progress import (
    StepProgress,
    expected_total,
    files_rows,
    progress_line,
    step_tag,
)


def test_line_has_done_total_rate_eta_and_elapsed():
    line = progress_line("decide", 12_000, 50_000, 3.0)
    assert line == "step decide: 12,000/50,000 messages (24%), 4,000/s, ETA 10s, 3s elapsed"
    unknown = progress_line("snapshot", 30_000, None, 75.0)
    assert unknown == "step snapshot: 30,000 messages so far, 400/s, 1m15s elapsed"  # no total, no ETA
    no_rows = progress_line("commit", None, None, 12.0)
    assert no_rows == "step commit: running, 12s elapsed"
    capped = progress_line("apply", 70, 50, 1.0)
    assert "50/50 messages (100%)" in capped
    starting = progress_line("decide", 0, 1_000, 2.0)
    assert starting == "step decide: 0/1,000 messages (0%), 0.0/s, 2s elapsed"  # no ETA at rate 0


def test_totals_come_from_earlier_steps():
    infos = {"snapshot": {"messages": 1000}, "decide": {"to_republish": 250}}
    state = SimpleNamespace(info=lambda name: infos.get(name, {}))
    assert expected_total(state, "snapshot", 900) == 900
    assert expected_total(state, "decide") == 1000
    assert expected_total(state, "record") == 1000
    assert expected_total(state, "apply") == 250
    assert expected_total(state, "commit") is None


def test_rows_written_sums_the_tasks_progress_files(tmp_path):
    from spark_apps.dlq_replay.task_parquet import rows_written

    assert rows_written(str(tmp_path)) is None  # no task has recorded anything yet
    assert rows_written(str(tmp_path / "missing")) is None
    (tmp_path / "_progress-00000").write_text("1200")
    (tmp_path / "_progress-00001").write_text("800")
    (tmp_path / "_progress-00001.5f3a").write_text("999")  # a record being replaced
    (tmp_path / "_progress-00002").write_text("")  # being written
    (tmp_path / "part-00000.parquet").write_text("not counted")
    assert rows_written(str(tmp_path)) == 2000
    assert rows_written(f"file://{tmp_path}") == 2000
    assert files_rows([str(tmp_path), str(tmp_path / "missing")]) == 2000
    for name in ("_progress-00000", "_progress-00001", "_progress-00001.5f3a", "_progress-00002"):
        (tmp_path / name).unlink()
    (tmp_path / "_SUCCESS").write_text("rows=2000\n")  # the job ended: its total
    assert rows_written(str(tmp_path)) == 2000
    (tmp_path / "_SUCCESS").write_text("")  # written by Spark: no count
    assert rows_written(str(tmp_path)) is None


def test_thread_logs_every_interval_and_stops(caplog):
    counts = iter([10, 20] + [30] * 1000)
    seen = threading.Event()
    progress = StepProgress(_TaggingSession(), interval=0.05, rows=lambda folders: next(counts))
    with caplog.at_level(logging.INFO, logger="spark_apps.dlq_replay"):
        progress.start("decide", 30)
        progress.count_files("/nowhere")
        while len(progress.lines) < 3:
            seen.wait(0.05)
        progress.stop()
    count = len(progress.lines)
    seen.wait(0.2)
    assert len(progress.lines) == count  # stopped
    assert progress.lines[0].startswith("step decide: 10/30 messages (33%)")
    assert any("step decide: 20/30" in r.getMessage() for r in caplog.records)


def test_a_step_without_files_or_message_rows_says_it_runs():
    asked: list[tuple[str, ...]] = []
    progress = StepProgress(
        _TaggingSession(), interval=0.02, rows=lambda folders: asked.append(tuple(folders)) or 5
    )
    progress.start("snapshot", 100)  # no count_files yet: nothing to count
    threading.Event().wait(0.15)
    progress.start("commit", None)
    progress.count_files("/somewhere")  # not counted: commit's rows are not messages
    threading.Event().wait(0.15)
    progress.stop()
    assert asked == []
    assert any(line.startswith("step snapshot: running, ") for line in progress.lines)
    assert progress.lines[-1].startswith("step commit: running, ")


def test_a_failing_count_never_breaks_the_step():
    def broken(folders):
        raise RuntimeError("the store is gone")

    progress = StepProgress(_TaggingSession(), interval=0.01, rows=broken)
    progress.start("snapshot", None)
    progress.count_files("s3://bucket/out")
    threading.Event().wait(0.1)
    progress.stop()
    assert progress.lines == []


class _TaggingSession:
    """What StepProgress uses of a SparkSession: its conf and the thread's job tags."""

    def __init__(self):
        self.tags: list[str] = []
        self.conf = SimpleNamespace(get=lambda key, default=None: default)

    def addTag(self, tag):
        self.tags.append(tag)

    def removeTag(self, tag):
        self.tags.remove(tag)


def test_the_step_jobs_are_tagged_while_it_runs():
    spark = _TaggingSession()
    progress = StepProgress(spark, interval=60)  # type: ignore[arg-type]
    progress.start("decide", None)
    assert spark.tags == [step_tag("decide")] == ["dlq-replay:decide"]
    progress.start("apply", None)  # the next step replaces the tag
    assert spark.tags == ["dlq-replay:apply"]
    progress.stop()
    progress.stop()
    assert spark.tags == []


def test_a_deliberate_wait_shows_no_eta_and_leaves_the_rate_alone():
    from spark_apps.dlq_replay.progress import WAITS, wait_line, waiting

    now = [100.0]
    with waiting("canary watch", 60, clock=lambda: now[0]):
        assert WAITS.current is not None
        now[0] = 130.0
        line = wait_line("apply", WAITS.current[0], WAITS.current[2] - now[0], 40.0)
    assert line == "step apply: waiting for the canary watch, 30s left (no ETA while waiting), 40s elapsed"
    assert WAITS.current is None
    assert WAITS.waited_since(90.0, 200.0) >= 30.0  # the 30 s waited are left out of the step's rate
