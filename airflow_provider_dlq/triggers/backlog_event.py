"""``DlqBacklogEventTrigger``: an ``AssetWatcher`` event trigger that fires when a DLQ fills up.

Used through the common-messaging ``MessageQueueTrigger(scheme="pulsar")`` or directly. It only reads
the subscription's backlog, never consumes; when it fires is :mod:`~airflow_provider_dlq.triggers.
backlog_watch`, whose state lives in the watched asset's state store. See ``docs/event-driven.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from airflow_provider_dlq.hooks.backlog import BacklogConfigError, BacklogReadError, split_topics
from airflow_provider_dlq.hooks.connection import PulsarConnectionError
from airflow_provider_dlq.hooks.pulsar import PulsarHook
from airflow_provider_dlq.triggers.backlog import BacklogPoll, poll_backlog
from airflow_provider_dlq.triggers.backlog_watch import (
    STATE_KEY,
    Thresholds,
    WatchState,
    evaluate,
    event_payload,
)
from pulsar_dlq_consumer.replay_options import DEFAULT_SUBSCRIPTION

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Hashable, Sequence


class DlqBacklogEventTrigger(BaseEventTrigger):
    """Fire an asset event when the backlog of ``subscription`` on ``topics`` crosses a threshold.

    An armed watch fires when the backlog (summed over ``topics``) above what the last replay left
    pending reaches ``min_backlog``, or its oldest message is ``max_age_seconds`` old; then it stays quiet
    until ``DlqBacklogRearmOperator`` re-arms it (or ``refire_after_seconds`` pass). Read errors are
    logged and retried at the next poll, never fired.

    :param topics: DLQ topics (full names, or globs over one namespace such as
        ``persistent://acme/orders/*-DLQ``).
    :param subscription: The subscription whose backlog counts (the replayer's, default ``dlq-replayer``).
    :param pulsar_conn_id: The ``pulsar`` connection; ``max_age_seconds`` needs its ``admin_url``.
    :param min_backlog: New pending messages that fire the watch (``None``: age only).
    :param max_age_seconds: Fire when the oldest new message is at least this old (``None``: count only).
    :param refire_after_seconds: Fire again when no replay re-armed the watch this long after it fired
        and the backlog is still there (``None``, the default: never).
    :param poll_interval: Seconds between backlog reads.
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
        self.topics = split_topics(topics)
        if not self.topics:
            raise ValueError(
                "topics is empty; give the DLQ topics to watch, e.g. ['persistent://t/ns/x-DLQ']."
            )
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
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "topics": list(self.topics),
                "subscription": self.subscription,
                "pulsar_conn_id": self.pulsar_conn_id,
                "min_backlog": self.thresholds.min_backlog,
                "max_age_seconds": self.thresholds.max_age_seconds,
                "refire_after_seconds": self.thresholds.refire_after_seconds,
                "poll_interval": self.poll_interval,
            },
        )

    def _store(self) -> Any:
        """The watched asset's state store accessor, or ``None`` (outside an asset watcher)."""
        store = getattr(self, "asset_state_store", None)
        if store is None:
            return None
        try:
            store._single_accessor()  # one watched asset; shared by several assets there is no one state
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
        store = self._store()
        if store is None:
            self._memory = state
            return True
        current = WatchState.from_json(await store.aget(STATE_KEY))
        if current != read:
            self.log.info("The watch state changed meanwhile (re-armed at %s); re-read", current.rearmed_at)
            return False
        await store.aset(STATE_KEY, state.to_json())
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
                        decision.baseline,
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
        if isinstance(exc, PulsarConnectionError | BacklogConfigError):
            self.log.error("The DLQ backlog cannot be watched (retrying each poll): %s", exc)
        elif isinstance(exc, BacklogReadError):
            self.log.warning("Reading the DLQ backlog failed (will retry): %s", exc)
        else:
            self.log.error("The DLQ backlog watch failed this poll (will retry)", exc_info=exc)
