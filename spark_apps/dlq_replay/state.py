"""Run state (``runs/<run>/state.json``): which steps of a run id are complete, so a re-run resumes from
the first incomplete step; a re-run must use the same options (the state keeps their fingerprint).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from spark_apps.dlq_replay.errors import OptionsChangedError, RunStateError

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
        entry = self.steps.setdefault(step, {})
        entry.update(info)
        entry.update(status="complete", finished_at=utc_now(), seconds=round(seconds, 3))

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


def resume_or_start(existing: RunState | None, run_id: str, mode: str, options: dict[str, Any]) -> RunState:
    """Return the state to continue with; refuse a run id reused with different options (``options``: the
    ones that shape its results, kept as a stable hash)."""
    digest = hashlib.sha256(json.dumps(options, sort_keys=True, default=str).encode("utf-8")).hexdigest()
    if existing is None:
        return RunState(run_id=run_id, mode=mode, fingerprint=digest, options=options)
    if existing.run_id != run_id:
        raise RunStateError(
            f"the run directory belongs to run id {existing.run_id!r}, not {run_id!r}; "
            "use another --output-dir"
        )
    if existing.fingerprint != digest:
        changed = sorted(
            k for k in set(options) | set(existing.options) if options.get(k) != existing.options.get(k)
        )
        raise OptionsChangedError(
            f"run id {run_id!r} was started with different options "
            f"(changed: {', '.join(changed) or 'unknown'}); "
            "re-run it with the same options to resume, or use a new --run-id"
        )
    existing.attempts += 1
    return existing
