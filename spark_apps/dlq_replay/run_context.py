"""One invocation of a replay run id (:class:`Run`): where it writes (:class:`RunPaths`) and its state
(:class:`RunState`: the complete steps, where a re-run with the same options resumes)."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from spark_apps.dlq_replay.errors import OptionsChangedError, RunStateError
from spark_apps.dlq_replay.progress import StepProgress, expected_total
from spark_apps.dlq_replay.session import default_parallelism
from spark_apps.dlq_replay.storage import RunStorage, join, qualify_root

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark_apps.dlq_replay.lock import RunLock
    from spark_apps.dlq_replay.options import ReplayOptions
    from spark_apps.dlq_replay.playbook import Playbook
    from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf

log = logging.getLogger("spark_apps.dlq_replay")

STEPS: tuple[str, ...] = ("plan", "snapshot", "decide", "apply", "record", "commit", "report")
STATE_FORMAT = 1
_SAFE = re.compile(r"[A-Za-z0-9._-]{1,120}")


def run_dir_name(run_id: str) -> str:
    """Directory name of a run: the id itself when it is path-safe, else a safe form + a short hash."""
    if _SAFE.fullmatch(run_id) and run_id not in (".", ".."):
        return run_id
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", run_id)[:80].strip(".") or "run"
    return f"{safe}-{hashlib.sha256(run_id.encode('utf-8')).hexdigest()[:10]}"


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@dataclass
class RunState:
    """The progress of one run id."""

    run_id: str
    mode: str
    fingerprint: str
    options: dict[str, Any]
    started_at: str = field(default_factory=utc_now)
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)
    attempts: int = 1

    def is_complete(self, step: str) -> bool:
        return self.steps.get(step, {}).get("status") == "complete"

    def mark_complete(self, step: str, seconds: float, **info: Any) -> None:
        if step not in STEPS:
            raise ValueError(f"unknown step {step!r}; steps are {', '.join(STEPS)}")
        done = {"status": "complete", "finished_at": utc_now(), "seconds": round(seconds, 3)}
        self.steps.setdefault(step, {}).update(info, **done)

    def progress(self, step: str) -> dict[str, Any]:
        """Mutable per-step progress (e.g. the DLQ topics already committed)."""
        return self.steps.setdefault(step, {"status": "running"})

    def info(self, step: str) -> dict[str, Any]:
        return dict(self.steps.get(step, {}))

    @property
    def timings(self) -> dict[str, float]:
        return {s: float(self.steps[s].get("seconds", 0.0)) for s in STEPS if self.is_complete(s)}

    def to_json(self) -> str:
        return json.dumps({"format": STATE_FORMAT, **asdict(self)}, indent=2, sort_keys=True, default=str)

    @classmethod
    def from_json(cls, text: str, *, where: str) -> RunState:
        try:
            data = json.loads(text)
            written = data.pop("format", None)
            if written != STATE_FORMAT:
                raise ValueError(f"format {written!r}")
            return cls(**data)
        except (ValueError, TypeError, AttributeError) as exc:
            raise RunStateError(
                f"{where} is not a valid run state ({exc}); delete the run directory or use a new run id"
            ) from exc


class RunPaths:
    """Where a run writes (see ``docs/replay-app.md``)."""

    def __init__(self, output_dir: str, run_id: str) -> None:
        self.root = qualify_root(output_dir)
        self.run = join(self.root, "runs", run_dir_name(run_id))
        self.plan = join(self.run, "plan.json")
        self.state = join(self.run, "state.json")
        self.snapshot = join(self.run, "snapshot")
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
        names = ("report_json", "report_html", "archive", "ledger", "snapshot")
        return {name: getattr(self, name) for name in names}


def load_state(storage: RunStorage, paths: RunPaths, options: ReplayOptions, playbook: Playbook) -> RunState:
    """The state to continue with (read only): a new one, or the saved one if its options are the same."""
    run_id, given = options.run_id, options.fingerprint_options(playbook.digest)
    digest = hashlib.sha256(json.dumps(given, sort_keys=True, default=str).encode("utf-8")).hexdigest()
    text = storage.read_text(paths.state)
    if not text:
        return RunState(run_id=run_id, mode=options.mode, fingerprint=digest, options=given)
    saved = RunState.from_json(text, where=paths.state)
    if saved.run_id != run_id:
        raise RunStateError(
            f"the run directory belongs to run id {saved.run_id!r}, not {run_id!r}; use another --output-dir"
        )
    if saved.fingerprint != digest:
        changed = sorted(k for k in set(given) | set(saved.options) if given.get(k) != saved.options.get(k))
        raise OptionsChangedError(
            f"run id {run_id!r} was started with different options "
            f"(changed: {', '.join(changed) or 'unknown'}); "
            "re-run it with the same options to resume, or use a new --run-id"
        )
    saved.attempts += 1
    return saved


class Run:
    """One invocation of a run id: options, state, the lock it holds and the step helpers."""

    def __init__(
        self, spark: SparkSession, options: ReplayOptions, playbook: Playbook, conf: PulsarConf, lock: RunLock
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

    def step(self, name: str) -> bool:
        """True when ``name`` must run now (logs the skip otherwise)."""
        self.lock.check()  # stops when another run took the lock or lease over
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
        self.lock.check()  # a step whose jobs were cancelled must not be recorded complete
        seconds = time.monotonic() - started
        self.state.mark_complete(name, seconds, **info)
        self.save()
        details = " ".join(f"{k}={v}" for k, v in info.items() if not isinstance(v, (dict, list)))
        log.info("step %s: complete in %.1fs %s", name, seconds, details)

    @property
    def buckets(self) -> int:
        return max(1, self.options.parallelism or default_parallelism(self.spark))

    @property
    def batch_rows(self) -> int:
        """Rows per Arrow batch of the run's Python tasks (Spark's ``maxRecordsPerBatch``)."""
        return int(self.spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch") or 10_000)
