"""The steps of a replay run, each in its module (``docs/replay-app.md``); a step is recorded complete in
``state.json`` only after its output is durable, and a re-run of the run id skips complete steps."""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay.apply import run_apply
from spark_apps.dlq_replay.arrow_util import use_jemalloc_pool
from spark_apps.dlq_replay.broker_checks import check_broker
from spark_apps.dlq_replay.commit import commit_info, run_commit
from spark_apps.dlq_replay.decide import run_decide
from spark_apps.dlq_replay.errors import ReplayConfigError
from spark_apps.dlq_replay.lock import run_lock
from spark_apps.dlq_replay.plan import run_plan
from spark_apps.dlq_replay.preflight import check_local, ship_and_load_fixes
from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf
from spark_apps.dlq_replay.pulsar_io.window import READER_MODE, read_mode_of
from spark_apps.dlq_replay.record import run_record
from spark_apps.dlq_replay.report import run_report
from spark_apps.dlq_replay.run_context import Run, RunPaths, load_state
from spark_apps.dlq_replay.snapshot import run_snapshot
from spark_apps.dlq_replay.storage import RunStorage, join

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark_apps.dlq_replay.options import ReplayOptions
    from spark_apps.dlq_replay.playbook import Playbook
    from spark_apps.dlq_replay.pulsar_io.window import PartitionWindow

log = logging.getLogger("spark_apps.dlq_replay")


def run_replay(
    spark: SparkSession, options: ReplayOptions, *, checked: Playbook | None = None
) -> dict[str, Any]:
    """Run (or resume) the run ``options.run_id`` under its lock; returns the report. ``checked``: the
    playbook of a caller that ran :func:`~spark_apps.dlq_replay.preflight.check_local` and broker checks."""
    use_jemalloc_pool()  # the driver's report reads, like the tasks' batches, free what they used
    playbook = checked if checked is not None else check_local(options)
    ship_and_load_fixes(spark, playbook)
    conf = PulsarConf.from_app_options(options)
    paths = RunPaths(options.output_dir, options.run_id)
    storage = RunStorage()
    state = load_state(storage, paths, options, playbook)  # a resume with changed options stops here
    text = storage.read_text(paths.report_json) if state.is_complete("report") else None
    if text:
        log.info("run %s is already complete; nothing to do", options.run_id)
        return dict(json.loads(text))
    if checked is None:  # before any file or lock is created
        check_broker(conf, options.topics)
    parts = (paths.run, join(paths.root, "locks"), join(paths.root, "runs"), paths.root)
    created = [path for path in parts if not storage.exists(path)]
    try:
        with run_lock(spark, paths.root, options, conf) as lock:
            run = Run(spark, options, playbook, conf, lock)
            try:
                return _run_steps(run)
            finally:
                run.progress.stop()  # a step that raised leaves no progress thread behind
    except ReplayConfigError:  # the Pulsar I/O's PulsarConfigError too
        if state.attempts == 1:  # an earlier attempt's files stay
            _remove_created(storage, paths.run, created)
        raise


def _remove_created(storage: RunStorage, run_dir: str, created: list[str]) -> None:
    """Remove what a refused first attempt created (its run dir, other parts if empty): exit 2 leaves none."""
    for path in created:
        try:
            if path == run_dir or not storage.list_names(path):
                storage.delete(path)
        except Exception as exc:  # the refusal matters more than the clean-up
            log.warning("could not remove %s after the refusal: %s", path, type(exc).__name__)


def _run_steps(run: Run) -> dict[str, Any]:
    options = run.options
    started_wall = datetime.now(UTC)
    log.info(
        "run %s (%s, attempt %d): topics=%s output=%s",
        options.run_id,
        options.mode,
        run.state.attempts,
        ",".join(options.topics),
        run.paths.run,
    )
    windows, planned_at = run_plan(run)
    if _skip_empty_window(run, windows):
        return run_report(run, started_wall)
    snapshot = run_snapshot(run, windows)
    decisions = run_decide(run, snapshot, planned_at)
    if options.mode != oc.DRY_RUN:
        run_apply(run, decisions, planned_at)
    run_record(run)  # a dry run's record step writes the report's parts only
    if options.mode != oc.DRY_RUN:
        run_commit(run, windows)
    return run_report(run, started_wall)


#: The steps that read, decide, send, record or ack messages (skipped whole for an empty window).
_MESSAGE_STEPS = ("snapshot", "decide", "apply", "record", "commit")


def _skip_empty_window(run: Run, windows: list[PartitionWindow]) -> bool:
    """The empty-DLQ fast path: the message steps recorded complete with zero counts, without a Spark job."""
    if any(s in run.state.steps for s in _MESSAGE_STEPS) or not all(
        w.end_message_id is None or (w.read_mode == READER_MODE and w.pending_entries == 0) for w in windows
    ):
        return False
    mode = read_mode_of(windows)
    zero: dict[str, dict[str, Any]] = {
        "snapshot": {"messages": 0, "dlq_reads": 0, "read_mode": mode, "empty_window": True},
        "decide": {"to_republish": 0, "max_sequence_id": -1, "producers_per_target": run.buckets},
        "apply": {"published": 0, "publish_failed": 0, "resent": 0, "resent_held": 0, "resend_bound": 0},
        "record": {},
        "commit": {"read_mode": mode, **commit_info({}, 0)},
    }
    steps = ("snapshot", "decide", "record") if run.options.mode == oc.DRY_RUN else _MESSAGE_STEPS
    for name in steps:
        if run.step(name):
            run.done(name, time.monotonic(), **zero[name])
    log.info("the window is empty: nothing to read, decide, send, record or ack")
    return True
