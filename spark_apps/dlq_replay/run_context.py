"""One invocation of a replay run id: where it writes (:class:`RunPaths`), its state and the lock it holds
(:class:`Run`), shared by the steps (``plan``, ``snapshot``, ``decide``, ``apply``, ``record``,
``commit``, ``report``) that :mod:`~spark_apps.dlq_replay.runner` runs in order."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from spark_apps.dlq_replay.progress import StepProgress, expected_total
from spark_apps.dlq_replay.state import RunState, resume_or_start, run_dir_name, utc_now
from spark_apps.dlq_replay.storage import RunStorage, join, qualify_root

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark_apps.dlq_replay.lock import RunLock
    from spark_apps.dlq_replay.options import ReplayOptions
    from spark_apps.dlq_replay.playbook import Playbook
    from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf

log = logging.getLogger("spark_apps.dlq_replay")


class RunPaths:
    """Where a run writes (see ``docs/replay-app.md``)."""

    def __init__(self, output_dir: str, run_id: str) -> None:
        self.root = qualify_root(output_dir)
        self.run = join(self.root, "runs", run_dir_name(run_id))
        self.plan = join(self.run, "plan.json")
        self.state = join(self.run, "state.json")
        self.snapshot = join(self.run, "snapshot")
        self.identities = join(self.run, "snapshot_identities")
        self.snapshot_entries = join(self.run, "snapshot_entries")
        self.commit_parts = join(self.run, "commit_parts")
        self.decisions = join(self.run, "decisions")
        self.decide_marks = join(self.run, "decide_marks")
        self.republish_results = join(self.run, "apply", "republish")
        self.canary_ids = join(self.run, "apply", "canary_ids")
        self.report_json = join(self.run, "report.json")
        self.report_html = join(self.run, "report.html")
        self.archive = join(self.root, "archive")
        self.archive_staged = join(self.run, "archive_staged")
        self.ledger = join(self.root, "ledger")
        self.ledger_staged = join(self.run, "ledger_staged")
        self.report_parts = join(self.run, "report_parts")

    def public(self) -> dict[str, str]:
        return {
            "report_json": self.report_json,
            "report_html": self.report_html,
            "archive": self.archive,
            "ledger": self.ledger,
            "snapshot": self.snapshot,
        }


def load_state(storage: RunStorage, paths: RunPaths, options: ReplayOptions, playbook: Playbook) -> RunState:
    """The state to continue with (read only): a new one, or the existing one when the options match;
    raises :class:`~spark_apps.dlq_replay.errors.OptionsChangedError` otherwise."""
    text = storage.read_text(paths.state)
    existing = RunState.from_json(text, where=paths.state) if text else None
    fingerprint = options.fingerprint_options(playbook.digest)
    return resume_or_start(existing, options.run_id, options.mode, fingerprint)


class Run:
    """One invocation of a run id: options, state, the lock it holds and the step helpers."""

    def __init__(
        self,
        spark: SparkSession,
        options: ReplayOptions,
        playbook: Playbook,
        conf: PulsarConf,
        lock: RunLock | None = None,
    ) -> None:
        self.spark = spark
        self.progress = StepProgress(spark)
        self.options = options
        self.playbook = playbook
        self.conf = conf
        self.lock = lock
        self.paths = RunPaths(options.output_dir, options.run_id)
        self.storage = RunStorage()
        self.state: RunState = load_state(self.storage, self.paths, options, playbook)
        self.save()

    def save(self) -> None:
        self.storage.write_text(self.paths.state, self.state.to_json())

    def check_lock(self) -> None:
        """Stop when another run took the lock or lease over (never interleave two runs)."""
        if self.lock is not None:
            self.lock.check()

    def step(self, name: str) -> bool:
        """True when ``name`` must run now (logs the skip otherwise)."""
        self.check_lock()
        if self.state.is_complete(name):
            log.info("step %s: already complete in an earlier attempt, skipped", name)
            return False
        self.state.progress(name).update(status="running", started_at=utc_now())
        self.save()
        log.info("step %s: started", name)
        self.progress.start(name, expected_total(self.state, name, self.progress.expected_snapshot()))
        return True

    def done(self, name: str, started: float, **info: Any) -> None:
        self.progress.stop()
        self.check_lock()  # a step whose jobs were cancelled must not be recorded complete
        seconds = time.monotonic() - started
        self.state.mark_complete(name, seconds, **info)
        self.save()
        details = " ".join(f"{k}={v}" for k, v in info.items() if not isinstance(v, (dict, list)))
        log.info("step %s: complete in %.1fs %s", name, seconds, details)

    @property
    def buckets(self) -> int:
        from spark_apps.dlq_replay.session import default_parallelism

        return max(1, self.options.parallelism or default_parallelism(self.spark))

    @property
    def batch_rows(self) -> int:
        """Rows per Arrow batch of the run's Python tasks (Spark's ``maxRecordsPerBatch``)."""
        return int(self.spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch") or 10_000)
