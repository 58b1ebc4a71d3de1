"""Run a step's independent small queries side by side, from driver threads: a short job's time goes
mostly to planning and scheduling on the driver, so run one after another they leave the cores idle.
Each thread inherits the caller's job tags, so the step's progress lines still cover them."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import SparkSession

#: Queries in flight at once: enough to overlap the driver's planning with the tasks of another job.
MAX_THREADS = 4


def run_concurrently(spark: SparkSession, *queries: Callable[[], Any]) -> list[Any]:
    """Each query's result, in the order given; the first error raised is raised here once all ended."""
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
