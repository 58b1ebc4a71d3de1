"""Progress of a long step on real local Spark: done/total, rate and ETA while the task still runs."""

from __future__ import annotations

import pytest

from spark_apps.dlq_replay.arrow_compat import map_in_arrow
from spark_apps.dlq_replay.progress import StepProgress

pytestmark = pytest.mark.integration


def test_progress_lines_show_messages_done_before_the_step_ends(spark, tmp_path):
    rows = 240_000
    task_s = 25.0  # longer than two executor heartbeats (10 s each by default), whatever the batch size

    def slow(batches):  # defined here: Spark pickles it by value, not by this test module's name
        import time

        for batch in batches:
            time.sleep(task_s * batch.num_rows / rows)  # rows flow at an even pace over the whole task
            yield batch

    spark.range(0, rows, numPartitions=1).selectExpr("id", "cast(id as string) AS s").write.parquet(
        str(tmp_path / "in")
    )
    df = spark.read.parquet(str(tmp_path / "in"))
    progress = StepProgress(spark, interval=1.0)
    progress.start("decide", rows)
    try:
        # One task of ~25 s: the executor heartbeats at 10 s and 20 s carry its live metrics mid-task.
        map_in_arrow(df, slow, df.schema).write.parquet(str(tmp_path / "out"))
    finally:
        progress.stop()
    partial = [line for line in progress.lines if "/240,000 messages (" in line and "(100%)" not in line]
    assert partial, progress.lines
    assert any("/s, ETA " in line for line in partial)
    assert spark.sparkContext.getLocalProperty("spark.jobGroup.id") is None


def test_progress_of_a_step_whose_tasks_write_their_files_counts_messages(spark, tmp_path):
    """A step whose Python tasks write their own Parquet (task_parquet) sends Spark one tally row per batch:
    the lines count the rows the tasks wrote (their progress files), not those tallies."""
    from spark_apps.dlq_replay import task_parquet

    rows = 60_000
    task_s = 8.0  # four progress records per task at PROGRESS_EVERY_S = 2 s

    def slow(batches):
        import time

        for batch in batches:
            time.sleep(task_s * batch.num_rows / (rows / 2))
            yield batch

    frame = spark.range(0, rows, numPartitions=2).selectExpr("id", "cast(id as string) AS s")
    schema = frame.schema
    out = str(tmp_path / "out")
    progress = StepProgress(spark, interval=1.0)
    progress.start("decide", rows)
    progress.count_files(out)
    try:
        tallies = task_parquet.write_in_tasks(frame, slow, schema, out, lambda b: (b.num_rows,), ("n",))
    finally:
        progress.stop()
    assert sum(t[0] for t in tallies) == rows
    partial = [line for line in progress.lines if "/60,000 messages (" in line and "(100%)" not in line]
    assert partial, progress.lines
    done = [int(line.split(":")[1].split("/")[0].replace(",", "")) for line in partial]
    assert max(done) >= 5_000, progress.lines  # messages, not the few tally rows Spark has seen
    assert task_parquet.rows_written(out) == rows  # the total, kept in _SUCCESS
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "_SUCCESS", "part-00000.parquet", "part-00001.parquet"
    ]  # fmt: skip
    assert spark.read.parquet(out).count() == rows
