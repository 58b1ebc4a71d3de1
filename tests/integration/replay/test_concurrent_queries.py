"""The report's queries run side by side from driver threads: results in order, errors raised, and the
step's job group kept on every job (what the progress lines and the step's job tags rely on)."""

from __future__ import annotations

import threading

import pytest

from spark_apps.dlq_replay.report import run_concurrently


def test_results_come_back_in_order_and_the_jobs_keep_the_callers_job_group(spark):
    context = spark.sparkContext
    group = "dlq-replay-test-concurrent"
    context.setJobGroup(group, "DLQ replay step report", interruptOnCancel=False)
    threads: set[str] = set()

    def count(n: int):
        def query() -> int:
            threads.add(threading.current_thread().name)
            return spark.range(n).filter("id % 2 = 0").count()

        return query

    try:
        results = run_concurrently(spark, count(10), count(100), count(1000))
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
        context.setLocalProperty("spark.job.description", None)
    assert results == [5, 50, 500]
    assert all(name.startswith("dlq-query") for name in threads)  # not the calling thread
    jobs = context.statusTracker().getJobIdsForGroup(group)
    assert len(jobs) >= 3  # every query's job carries the group set in the calling thread


def test_an_error_in_one_query_is_raised_after_the_others_ended(spark):
    finished: list[int] = []

    def ok() -> int:
        finished.append(spark.range(50).count())
        return 1

    def broken() -> int:
        raise ValueError("query failed")

    with pytest.raises(ValueError, match="query failed"):
        run_concurrently(spark, ok, broken, ok)
    assert finished == [50, 50]


def test_a_single_query_runs_in_the_calling_thread(spark):
    names: list[str] = []

    def query() -> int:
        names.append(threading.current_thread().name)
        return 7

    assert run_concurrently(spark, query) == [7]
    assert names == [threading.current_thread().name]
