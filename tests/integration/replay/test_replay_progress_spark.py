"""Progress of a long step on real local Spark: done/total, rate and ETA while its tasks still run, from
the tasks' own progress files; the step's jobs carry its tag, and a lost run lock stops them."""

from __future__ import annotations

import threading
import time

import pytest

from spark_apps.dlq_replay.progress import StepProgress, step_tag

pytestmark = pytest.mark.integration


def test_progress_of_a_step_whose_tasks_write_their_files_counts_messages(spark, tmp_path):
    """A step whose Python tasks write their own Parquet (task_parquet) sends Spark one tally row per batch:
    the lines count the rows the tasks wrote (their progress files) while the tasks still run."""
    from spark_apps.dlq_replay import task_parquet

    rows = 60_000
    task_s = 8.0  # four progress records per task at PROGRESS_EVERY_S = 2 s

    def slow(batches):  # defined here: Spark pickles it by value, not by this test module's name
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
    assert any("/s, ETA " in line for line in partial)
    done = [int(line.split(":")[1].split("/")[0].replace(",", "")) for line in partial]
    assert max(done) >= 5_000, progress.lines  # messages, not the few tally rows Spark has seen
    assert spark.getTags() == set()  # untagged once the step stopped
    assert spark.read.parquet(out).count() == rows


def test_a_lost_lock_interrupts_the_running_step_from_its_heartbeat_thread(spark):
    """The run lock's heartbeat thread stops the step's running job (``RunLock.interrupt``); the job
    carries the step's tag meanwhile, and later jobs of the session run as before."""
    from spark_apps.dlq_replay.lock import RunLock

    progress = StepProgress(spark, interval=60)
    progress.start("apply", None)
    assert step_tag("apply") in spark.getTags()

    def slow(batches):
        import time

        for batch in batches:
            time.sleep(30)
            yield batch

    stopper = threading.Timer(3.0, RunLock(None, None, spark).interrupt)  # another thread, as the heartbeat
    stopper.start()
    started = time.monotonic()
    try:
        with pytest.raises(Exception, match=r"(?i)cancel|interrupt"):
            spark.range(0, 4, numPartitions=2).mapInArrow(slow, "id long").collect()
    finally:
        stopper.cancel()
        progress.stop()
    assert time.monotonic() - started < 25  # stopped, not run to its end
    assert spark.getTags() == set()
    assert spark.range(3).count() == 3
