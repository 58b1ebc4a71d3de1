"""``DlqBacklogEventTrigger``: an ``AssetWatcher`` event trigger that fires when a DLQ fills up."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from airflow_provider_dlq.hooks.backlog import BacklogReadError
from airflow_provider_dlq.hooks.pulsar import PulsarHook
from airflow_provider_dlq.triggers.backlog import CONFIG_ERRORS, BacklogPoll, poll_backlog, topic_names
from pulsar_dlq_consumer.replay_options import DEFAULT_SUBSCRIPTION

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Hashable, Mapping, Sequence

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
    """One poll's verdict: the total backlog, the part above the state's baseline (``new``) and its age."""

    fire: bool
    reason: str | None
    state: WatchState
    total: int
    new: int
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
    return Decision(reason is not None, reason, updated, total, new, age)


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
        "baseline": decision.state.baseline,
        "oldest_new_age_seconds": None if age is None else round(age, 3),
        "topics": {
            topic: {"backlog": b.backlog, "oldest_age_seconds": b.oldest_age_seconds, "source": b.source}
            for topic, b in sorted(backlogs.items())
        },
    }


class DlqBacklogEventTrigger(BaseEventTrigger):
    """Fire an asset event when the backlog of ``subscription`` on ``topics``, above what the last replay
    left pending, crosses a threshold; then stay quiet until ``DlqBacklogRearmOperator`` re-arms the watch.

    .. seealso:: ``docs/event-driven.md`` (its arguments' table)
    """

    def __init__(
        self,
        *,
        topics: Sequence[str] | str,
        subscription: str = DEFAULT_SUBSCRIPTION,
        pulsar_conn_id: str = PulsarHook.default_conn_name,
        min_backlog: int | None = 1,
        max_age_seconds: float | None = None,
        refire_after_seconds: float | None = None,
        poll_interval: float = 30.0,
    ) -> None:
        super().__init__()
        self.topics = topic_names(topics)
        if not subscription or not str(subscription).strip():
            raise ValueError("subscription must be a non-empty name, e.g. 'dlq-replayer'.")
        if isinstance(poll_interval, bool) or not float(poll_interval) > 0:
            raise ValueError(f"poll_interval must be a positive number of seconds; got {poll_interval!r}.")
        self.thresholds = Thresholds(
            min_backlog=min_backlog,
            max_age_seconds=None if max_age_seconds is None else float(max_age_seconds),
            refire_after_seconds=None if refire_after_seconds is None else float(refire_after_seconds),
        )
        self.subscription = str(subscription)
        self.pulsar_conn_id = pulsar_conn_id
        self.poll_interval = float(poll_interval)
        self._memory: WatchState | None = None  # used only when no asset state store is available
        self._announced = False

    def serialize(self) -> tuple[str, dict[str, Any]]:
        kwargs = {name: getattr(self, name) for name in ("topics", "subscription", "pulsar_conn_id")}
        kwargs.update(asdict(self.thresholds), poll_interval=self.poll_interval)  # key order is hashed
        return f"{type(self).__module__}.{type(self).__qualname__}", kwargs

    def _store(self) -> Any:
        """The watched asset's state store accessor, or ``None`` (outside an asset watcher)."""
        store: Any = getattr(self, "asset_state_store", None)
        try:  # AttributeError: no store; ValueError: shared by several assets, so there is no one state
            store._single_accessor()
        except (AttributeError, ValueError):
            return None
        return store

    async def _load(self) -> WatchState:
        store = self._store()
        if store is None:
            return self._memory or WatchState()
        return WatchState.from_json(await store.aget(STATE_KEY))

    async def _save(self, state: WatchState, read: WatchState) -> bool:
        """Store ``state`` unless the stored state changed since it was ``read`` (a re-arm)."""
        if (current := await self._load()) != read:
            self.log.info("The watch state changed meanwhile (re-armed at %s); re-read", current.rearmed_at)
            return False
        if (store := self._store()) is None:
            self._memory = state
        else:
            await store.aset(STATE_KEY, asdict(state))
        return True

    def shared_stream_key(self) -> Hashable:
        """Watchers of the same backlog share one poll (Airflow 3.3+), each with its own thresholds."""
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            self.pulsar_conn_id,
            self.subscription,
            tuple(sorted(set(self.topics))),
            self.poll_interval,
        )

    @classmethod
    async def open_shared_stream(cls, kwargs: dict[str, Any]) -> AsyncIterator[BacklogPoll]:
        """The group's one poll: a :class:`BacklogPoll` every ``poll_interval`` seconds, forever."""
        trigger = cls(**kwargs)
        async for poll in poll_backlog(
            trigger.pulsar_conn_id, trigger.topics, trigger.subscription, trigger.poll_interval
        ):
            yield poll

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        async for poll in shared_stream:
            async for event in self._observe(poll):
                yield event

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """The standalone poll (Airflow without shared streams, or a trigger run outside a watcher)."""
        async for event in self.filter_shared_stream(self.open_shared_stream(self.serialize()[1])):
            yield event

    async def _observe(self, poll: BacklogPoll) -> AsyncIterator[TriggerEvent]:
        """Apply one poll to this watch: fire (state stored first) or update the state."""
        if poll.error is not None:
            self._log_failure(poll.error)
            return
        try:
            state = await self._load()
            self._announce(state)
            decision = evaluate(state, poll.backlogs, poll.at, self.thresholds)
            if decision.fire:
                # Stored before the event is handed over: a restart after this never fires twice.
                if await self._save(decision.state, state):
                    self.log.info(
                        "DLQ backlog %d (new %d, baseline %d) fires the watch (%s)",
                        decision.total,
                        decision.new,
                        decision.state.baseline,
                        decision.reason,
                    )
                    yield TriggerEvent(event_payload(decision, poll.backlogs, self.subscription, poll.at))
            elif state.armed and decision.state != state:
                await self._save(decision.state, state)
            else:
                armed = "armed" if state.armed else "disarmed"
                self.log.debug("DLQ backlog %d (new %d): %s", decision.total, decision.new, armed)
        except Exception as exc:
            # A watcher outlives passing faults (e.g. the metadata DB behind the state store).
            self._log_failure(exc)

    def _announce(self, state: WatchState) -> None:
        if self._announced:
            return
        self._announced = True
        if self._store() is None:
            self.log.warning(
                "No asset state store (not run by one AssetWatcher of one asset): the watch state is kept in "
                "memory, so a triggerer restart forgets whether it fired."
            )
        self.log.info(
            "Watching the backlog of %s on %s (%s, baseline %d, fired %d times)",
            self.subscription,
            ",".join(self.topics),
            "armed" if state.armed else "disarmed until a replay re-arms it",
            state.baseline,
            state.fires,
        )

    def _log_failure(self, exc: Exception) -> None:
        if isinstance(exc, CONFIG_ERRORS):
            self.log.error("The DLQ backlog cannot be watched (retrying each poll): %s", exc)
        elif isinstance(exc, BacklogReadError):
            self.log.warning("Reading the DLQ backlog failed (will retry): %s", exc)
        else:
            self.log.error("The DLQ backlog watch failed this poll (will retry)", exc_info=exc)
