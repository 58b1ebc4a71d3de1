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
