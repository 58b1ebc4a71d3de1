"""When the DLQ backlog watch fires, and the state that makes it fire once (pure logic).

An **armed** watch fires when the backlog above the ``baseline`` (what the last replay left pending)
reaches ``min_backlog`` or is ``max_age_seconds`` old, then disarms until the replay DAG re-arms it (or
``refire_after_seconds`` pass). The state lives in the watched asset's state store under :data:`STATE_KEY`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

    from airflow_provider_dlq.hooks.backlog import TopicBacklog

#: Key of the watch state in the watched asset's state store.
STATE_KEY = "pulsar_dlq_backlog_watch"
REASON_MIN_BACKLOG = "min_backlog"
REASON_MAX_AGE = "max_age"
REASON_REFIRE = "refire_after"


def iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class Thresholds:
    """When an armed watch fires (either condition), and when a disarmed one may fire again."""

    min_backlog: int | None = 1
    max_age_seconds: float | None = None
    refire_after_seconds: float | None = None

    def __post_init__(self) -> None:
        count = self.min_backlog
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
            raise ValueError(f"min_backlog must be an integer >= 1 or None; got {self.min_backlog!r}.")
        for name in ("max_age_seconds", "refire_after_seconds"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not float(value) > 0):
                raise ValueError(f"{name} must be a positive number of seconds or None; got {value!r}.")
        if self.min_backlog is None and self.max_age_seconds is None:
            raise ValueError(
                "Give min_backlog (pending messages) or max_age_seconds (age of the oldest one), or both: "
                "with neither the watch would never fire."
            )


@dataclass(frozen=True)
class WatchState:
    """What the watch remembers across polls and triggerer restarts (JSON in the state store)."""

    armed: bool = True
    #: Messages the last replay left pending on purpose (skipped, fix-failed, malformed...): not new.
    baseline: int = 0
    #: When the watch first saw backlog above the baseline.
    new_since: float | None = None
    fired_at: float | None = None
    fires: int = 0
    fired_backlog: int | None = None
    rearmed_at: float | None = None
    rearmed_by: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, value: Any) -> WatchState:
        """The stored state; a missing or unreadable one is a fresh, armed watch."""
        if not isinstance(value, dict):
            return cls()
        known = {f.name for f in fields(cls)}
        try:
            state = cls(**{k: v for k, v in value.items() if k in known})
            int(state.baseline)
        except (TypeError, ValueError):
            return cls()
        return state


@dataclass(frozen=True)
class Decision:
    """One poll: the backlog summed over the watched topics, the part above the baseline (``new``) and its
    age, whether the watch fires and the state to store."""

    fire: bool
    reason: str | None
    state: WatchState
    total: int
    new: int
    baseline: int
    oldest_new_age_seconds: float | None


def evaluate(
    state: WatchState, backlogs: Mapping[str, TopicBacklog], now: float, thresholds: Thresholds
) -> Decision:
    """Decide one poll: fire or not, and the state to store (the baseline drops with the backlog)."""
    total = sum(max(0, int(b.backlog)) for b in backlogs.values())
    baseline = min(max(0, int(state.baseline)), total)
    new = total - baseline
    new_since: float | None = None
    age: float | None = None
    if new > 0:
        new_since = now if state.new_since is None else state.new_since
        broker_ages = [b.oldest_age_seconds for b in backlogs.values() if b.oldest_age_seconds is not None]
        # All pending is new: the broker's age is exact; else since the watch first saw it (one poll late).
        age = max(broker_ages) if baseline == 0 and broker_ages else max(0.0, now - new_since)
    updated = replace(state, baseline=baseline, new_since=new_since)
    reason = None
    if thresholds.min_backlog is not None and new >= thresholds.min_backlog:
        reason = REASON_MIN_BACKLOG
    elif thresholds.max_age_seconds is not None and age is not None and age >= thresholds.max_age_seconds:
        reason = REASON_MAX_AGE
    if reason is not None and not state.armed:
        refire = thresholds.refire_after_seconds
        due = refire is not None and state.fired_at is not None and now - state.fired_at >= refire
        reason = REASON_REFIRE if due else None
    if reason is not None:
        updated = replace(
            updated, armed=False, new_since=None, fired_at=now, fires=state.fires + 1, fired_backlog=total
        )
    return Decision(reason is not None, reason, updated, total, new, baseline, age)


def rearmed(state: WatchState, baseline: int, by: str, now: float) -> WatchState:
    """The state after a successful replay: armed, with what the replay left pending as the baseline."""
    if isinstance(baseline, bool) or not isinstance(baseline, int) or baseline < 0:
        raise ValueError(f"baseline must be an integer >= 0 (messages left pending); got {baseline!r}.")
    return replace(state, armed=True, baseline=baseline, new_since=None, rearmed_at=now, rearmed_by=by)


def event_payload(
    decision: Decision, backlogs: Mapping[str, TopicBacklog], subscription: str, now: float
) -> dict[str, Any]:
    """The ``TriggerEvent`` payload (the asset event's ``extra.payload``): counts, no message payloads."""
    age = decision.oldest_new_age_seconds
    return {
        "reason": decision.reason,
        "fired_at": iso(now),
        "fire": decision.state.fires,
        "subscription": subscription,
        "backlog": decision.total,
        "new_backlog": decision.new,
        "baseline": decision.baseline,
        "oldest_new_age_seconds": None if age is None else round(age, 3),
        "topics": {
            topic: {"backlog": b.backlog, "oldest_age_seconds": b.oldest_age_seconds, "source": b.source}
            for topic, b in sorted(backlogs.items())
        },
    }
