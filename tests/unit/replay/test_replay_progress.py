"""Progress lines of long steps (pure parts: formatting, totals, plan metrics, the logging thread)."""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace

from spark_apps.dlq_replay.progress import Sample, StepProgress, expected_total, progress_line, rows_from_plan


def test_line_has_done_total_rate_eta_and_tasks():
    line = progress_line("decide", Sample(4, 1, 2, 12_000), 50_000, 3.0)
    assert line == (
        "step decide: 12,000/50,000 messages (24%), 4,000/s, ETA 10s; tasks 1/4 done, 2 running, 3s elapsed"
    )
    unknown = progress_line("snapshot", Sample(4, 2, 2, 30_000), None, 75.0)
    assert unknown.startswith("step snapshot: 30,000 messages so far, 400/s, ETA 1m15s;")  # ETA from tasks
    no_rows = progress_line("commit", Sample(2, 0, 2, None), None, 12.0)
    assert no_rows == "step commit: tasks 0/2 done, 2 running, 12s elapsed"
    capped = progress_line("apply", Sample(1, 0, 1, 70), 50, 1.0)
    assert "50/50 messages (100%)" in capped


def test_totals_come_from_earlier_steps():
    infos = {"snapshot": {"messages": 1000}, "decide": {"to_republish": 250}}
    state = SimpleNamespace(info=lambda name: infos.get(name, {}))
    assert expected_total(state, "snapshot", 900) == 900
    assert expected_total(state, "decide") == 1000
    assert expected_total(state, "record") == 1000
    assert expected_total(state, "apply") == 250
    assert expected_total(state, "commit") is None


def test_rows_come_from_the_last_python_node_not_the_read_ahead_scan():
    nodes = [
        ("Execute InsertIntoHadoopFsRelationCommand", {"number of output rows": None}),
        ("MapInArrow", {"data returned from Python workers": "4 MiB", "number of output rows": "190,000"}),
        ("Scan parquet", {"number of output rows": "400,000"}),
    ]
    assert rows_from_plan(nodes) == 190_000
    assert rows_from_plan([nodes[0], nodes[2]]) == 400_000  # no Python node: the scan
    assert rows_from_plan([nodes[0]]) is None


def test_thread_logs_every_interval_and_stops(caplog):
    samples = iter([Sample(2, 0, 2, 10), Sample(2, 1, 1, 20)] + [Sample(2, 2, 0, 30)] * 100)
    seen = threading.Event()
    progress = StepProgress(None, interval=0.05, sampler=lambda group: next(samples))
    with caplog.at_level(logging.INFO, logger="spark_apps.dlq_replay"):
        progress.start("decide", 30)
        while len(progress.lines) < 3:
            seen.wait(0.05)
        progress.stop()
    count = len(progress.lines)
    seen.wait(0.2)
    assert len(progress.lines) == count  # stopped
    assert progress.lines[0].startswith("step decide: 10/30 messages (33%)")
    assert any("step decide: 20/30" in r.getMessage() for r in caplog.records)


def test_a_failing_sampler_never_breaks_the_step():
    def broken(group):
        raise RuntimeError("spark is gone")

    progress = StepProgress(None, interval=0.01, sampler=broken)
    progress.start("snapshot", None)
    threading.Event().wait(0.1)
    progress.stop()
    assert progress.lines == []


def test_rows_written_sums_the_tasks_progress_files(tmp_path):
    from spark_apps.dlq_replay.task_parquet import rows_written

    assert rows_written(str(tmp_path)) is None  # no task has recorded anything yet
    assert rows_written(str(tmp_path / "missing")) is None
    (tmp_path / "_progress-00000").write_text("1200")
    (tmp_path / "_progress-00001").write_text("800")
    (tmp_path / "_progress-00001.5f3a").write_text("999")  # a record being replaced
    (tmp_path / "part-00000.parquet").write_text("not counted")
    assert rows_written(str(tmp_path)) == 2000
    assert rows_written(f"file://{tmp_path}") == 2000
    for name in ("_progress-00000", "_progress-00001", "_progress-00001.5f3a"):
        (tmp_path / name).unlink()
    (tmp_path / "_SUCCESS").write_text("rows=2000\n")  # the job ended: its total
    assert rows_written(str(tmp_path)) == 2000
    (tmp_path / "_SUCCESS").write_text("")  # written by Spark: no count
    assert rows_written(str(tmp_path)) is None


def test_lines_count_the_files_rows_when_the_step_has_any():
    files = {"rows": 0}
    progress = StepProgress(None, interval=0.05, sampler=lambda group: Sample(2, 0, 2, 3))
    progress.start("decide", 10_000)
    progress._file_rows = lambda: files["rows"]  # type: ignore[method-assign]
    progress.count_files("/nowhere")
    files["rows"] = 4_000
    deadline = threading.Event()
    deadline.wait(0.5)
    progress.stop()
    assert progress.lines
    assert progress.lines[-1].startswith("step decide: 4,000/10,000 messages (40%)")  # not Spark's 3


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
