"""Run a step's independent small queries side by side, from driver threads.

The report's aggregates are a dozen small queries over the run's datasets. Each is a short job whose
time goes mostly to planning on the driver and to scheduling, not to tasks, so run one after another
they leave the cores idle between jobs. Submitted from threads, Spark plans and runs them at the same
time (jobs from different threads of one application run concurrently). Each thread inherits the
caller's job group and description, so the step's progress lines and job tags still cover them.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import SparkSession

#: Queries in flight at once: enough to overlap the driver's planning with the tasks of another job.
MAX_THREADS = 4


def run_concurrently(spark: SparkSession, *queries: Callable[[], Any]) -> list[Any]:
    """Each query's result, in the order given; the first error raised is raised here once all ended.
    The queries run Spark jobs of ``spark``; their threads inherit its tags and the caller's job group."""
    if len(queries) <= 1:
        return [query() for query in queries]
    from pyspark.util import inheritable_thread_target

    # Wrapped now, in the caller's thread: that is when the job group and description are captured.
    inherit = inheritable_thread_target(spark)
    targets = [inherit(query) for query in queries]
    workers = min(MAX_THREADS, len(targets))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dlq-query") as pool:
        futures = [pool.submit(target) for target in targets]
    return [future.result() for future in futures]
