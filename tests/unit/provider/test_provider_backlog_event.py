"""The event-driven backlog watch: firing rules, state that survives restarts, the ``pulsar`` queue scheme.

Pure logic and the trigger's loop with a fake backlog source and a fake asset state store (the real
triggerer and Apache Pulsar are in tests/integration/ui/test_event_driven_replay.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict

import pytest

from airflow_provider_dlq.hooks.backlog import BacklogReadError, TopicBacklog
from airflow_provider_dlq.triggers.backlog_event import (
    REASON_MAX_AGE,
    REASON_MIN_BACKLOG,
    REASON_REFIRE,
    STATE_KEY,
    DlqBacklogEventTrigger,
    Thresholds,
    WatchState,
    evaluate,
    rearmed,
)

DLQ = "persistent://public/default/orders-DLQ"
DLQ2 = "persistent://public/default/pay-DLQ"


def backlog(n: int, age: float | None = None, topic: str = DLQ) -> dict[str, TopicBacklog]:
    return {topic: TopicBacklog(topic, "dlq-replayer", n, "admin", True, age)}


def test_thresholds_validate_and_name_the_fix():
    with pytest.raises(ValueError, match="min_backlog must be an integer"):
        Thresholds(min_backlog=0)
    with pytest.raises(ValueError, match="max_age_seconds must be a positive"):
        Thresholds(max_age_seconds=-1)
    with pytest.raises(ValueError, match="would never fire"):
        Thresholds(min_backlog=None, max_age_seconds=None)


def test_fires_once_per_backlog_until_rearmed_then_only_above_the_baseline():
    rules = Thresholds(min_backlog=5)
    state = WatchState()
    d = evaluate(state, backlog(4), 100.0, rules)
    assert not d.fire
    d = evaluate(d.state, backlog(5), 101.0, rules)
    assert d.fire
    assert d.reason == REASON_MIN_BACKLOG
    assert d.state.armed is False
    assert d.state.fires == 1
    assert d.state.fired_backlog == 5
    # The same backlog (and more) never fires again while disarmed.
    for t, n in ((102.0, 5), (103.0, 50), (10_000.0, 50)):
        assert not evaluate(d.state, backlog(n), t, rules).fire
    # A replay left 3 messages pending on purpose: they are the baseline, not new.
    armed = rearmed(d.state, baseline=3, by="dag/run", now=200.0)
    assert armed.armed
    assert armed.baseline == 3
    assert armed.rearmed_by == "dag/run"
    assert not evaluate(armed, backlog(7), 201.0, rules).fire  # 4 new
    again = evaluate(armed, backlog(8), 202.0, rules)  # 5 new
    assert again.fire
    assert again.new == 5
    assert again.state.fires == 2


def test_baseline_drops_when_pending_messages_go_away():
    rules = Thresholds(min_backlog=2)
    state = rearmed(WatchState(), baseline=10, by="x", now=0.0)
    d = evaluate(state, backlog(1), 1.0, rules)  # someone drained the DLQ by hand
    assert d.state.baseline == 1
    assert not d.fire
    assert evaluate(d.state, backlog(3), 2.0, rules).fire


def test_age_from_the_broker_when_everything_is_new_else_from_first_sight():
    rules = Thresholds(min_backlog=100, max_age_seconds=60)
    fresh = evaluate(WatchState(), backlog(1, age=61.0), 0.0, rules)
    assert fresh.fire
    assert fresh.reason == REASON_MAX_AGE
    # With a baseline the broker's oldest message is an old, left-pending one: age counts from first sight.
    armed = rearmed(WatchState(), baseline=2, by="x", now=0.0)
    first = evaluate(armed, backlog(3, age=9999.0), 1000.0, rules)
    assert not first.fire
    assert first.state.new_since == 1000.0
    assert not evaluate(first.state, backlog(3, age=9999.0), 1059.0, rules).fire
    late = evaluate(first.state, backlog(3, age=9999.0), 1060.0, rules)
    assert late.fire
    assert late.reason == REASON_MAX_AGE


def test_refire_after_only_when_no_replay_rearmed_and_the_backlog_is_still_there():
    rules = Thresholds(min_backlog=1, refire_after_seconds=600)
    fired = evaluate(WatchState(), backlog(3), 0.0, rules).state
    assert not evaluate(fired, backlog(3), 599.0, rules).fire
    assert not evaluate(fired, backlog(0), 700.0, rules).fire
    refire = evaluate(fired, backlog(3), 600.0, rules)
    assert refire.fire
    assert refire.reason == REASON_REFIRE
    assert refire.state.fired_at == 600.0


def test_backlog_is_summed_over_topics_and_state_json_round_trips():
    both = {**backlog(2), **backlog(3, topic=DLQ2)}
    d = evaluate(WatchState(), both, 5.0, Thresholds(min_backlog=5))
    assert d.fire
    assert d.total == 5
    assert WatchState.from_json(asdict(d.state)) == d.state
    assert WatchState.from_json(None) == WatchState()
    assert WatchState.from_json({"baseline": "x"}) == WatchState()


# --------------------------------------------------------------------------- the trigger's loop


class FakeStore:
    """The asset state store of one watched asset (what the triggerer injects)."""

    def __init__(self) -> None:
        self.values: dict[str, object] = {}
        self.writes = 0

    def _single_accessor(self) -> FakeStore:
        return self

    async def aget(self, key, default=None):
        return self.values.get(key, default)

    async def aset(self, key, value):
        self.writes += 1
        self.values[key] = value


class _Done(BaseException):
    """Ends the trigger's endless loop after the last reading (the loop outlives any Exception)."""


def run_polls(trigger: DlqBacklogEventTrigger, readings: list, monkeypatch) -> list[dict]:
    """Drive the trigger's loop over ``readings`` (one per poll; an exception is a failed read)."""
    feed = iter(readings)

    async def fake_backlog(self, topics, subscription):
        value = next(feed, None)
        if value is None:
            raise _Done
        if isinstance(value, Exception):
            raise value
        return value

    monkeypatch.setattr("airflow_provider_dlq.hooks.pulsar.PulsarHook.aget_backlog", fake_backlog)
    events: list[dict] = []

    async def drive():
        gen = trigger.run()
        try:
            while True:
                events.append((await asyncio.wait_for(gen.__anext__(), timeout=5)).payload)
        except _Done:
            pass
        finally:
            await gen.aclose()

    asyncio.run(drive())
    return events


def make_trigger(store: FakeStore | None, **kwargs) -> DlqBacklogEventTrigger:
    trigger = DlqBacklogEventTrigger(topics=[DLQ], min_backlog=3, poll_interval=0.001, **kwargs)
    trigger.asset_state_store = store
    return trigger


def test_trigger_serialize_mirrors_init_and_validates():
    trigger = DlqBacklogEventTrigger(topics=f"{DLQ}, {DLQ2}", min_backlog=10, max_age_seconds=60)
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_provider_dlq.triggers.backlog_event.DlqBacklogEventTrigger"
    assert kwargs == {
        "topics": [DLQ, DLQ2],
        "subscription": "dlq-replayer",
        "pulsar_conn_id": "pulsar_default",
        "min_backlog": 10,
        "max_age_seconds": 60.0,
        "refire_after_seconds": None,
        "poll_interval": 30.0,
    }
    assert DlqBacklogEventTrigger(**kwargs).serialize() == (classpath, kwargs)
    with pytest.raises(ValueError, match="no DLQ topics given"):
        DlqBacklogEventTrigger(topics=[])
    with pytest.raises(ValueError, match="poll_interval"):
        DlqBacklogEventTrigger(topics=[DLQ], poll_interval=0)


def test_trigger_fires_once_stores_state_first_and_a_restart_does_not_fire_again(monkeypatch):
    store = FakeStore()
    readings = [backlog(1), BacklogReadError("HTTP 503"), backlog(3), backlog(3), backlog(9)]
    events = run_polls(make_trigger(store), readings, monkeypatch)
    assert len(events) == 1
    assert events[0]["backlog"] == 3
    assert events[0]["reason"] == REASON_MIN_BACKLOG
    assert events[0]["topics"][DLQ]["backlog"] == 3
    stored = WatchState.from_json(store.values[STATE_KEY])
    assert stored.armed is False
    assert stored.fires == 1
    # A new trigger instance (a restarted triggerer) reads the state: the same backlog never fires again.
    assert run_polls(make_trigger(store), [backlog(9), backlog(12)], monkeypatch) == []
    # The replay DAG re-arms it with what it left pending (2): 3 new messages fire it again.
    store.values[STATE_KEY] = asdict(rearmed(stored, 2, by="d/r", now=1.0))
    events = run_polls(make_trigger(store), [backlog(4), backlog(5)], monkeypatch)
    assert [e["new_backlog"] for e in events] == [3]
    assert events[0]["baseline"] == 2
    assert events[0]["fire"] == 2


def test_trigger_without_a_state_store_keeps_state_in_memory(monkeypatch):
    trigger = make_trigger(None)
    assert len(run_polls(trigger, [backlog(5), backlog(6)], monkeypatch)) == 1


def test_pulsar_scheme_resolves_to_the_backlog_event_trigger():
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger

    from airflow_provider_dlq.queues.pulsar import PulsarMessageQueueProvider

    trigger = MessageQueueTrigger(scheme="pulsar", topics=[DLQ], subscription="s", min_backlog=7)
    classpath, kwargs = trigger.serialize()
    assert classpath.endswith("DlqBacklogEventTrigger")
    assert kwargs["min_backlog"] == 7
    assert kwargs["subscription"] == "s"
    provider = PulsarMessageQueueProvider()
    assert provider.scheme_matches("pulsar")
    assert not provider.scheme_matches("kafka")
    assert provider.queue_matches(DLQ)
    assert not provider.queue_matches("kafka://x/y")
    assert provider.trigger_kwargs(DLQ) == {"topics": [DLQ]}
    assert provider.trigger_kwargs(DLQ, topics=[DLQ2]) == {}


# --------------------------------------------------------------------------- shared stream (Airflow 3.3)


def test_shared_stream_key_groups_watchers_of_the_same_backlog():
    key = DlqBacklogEventTrigger(topics=[DLQ, DLQ2], min_backlog=3).shared_stream_key()
    # Same connection, subscription and topics (any order): one poll, whatever the thresholds.
    assert DlqBacklogEventTrigger(topics=f"{DLQ2},{DLQ}", max_age_seconds=60).shared_stream_key() == key
    hash(key)
    for other in (
        {"topics": [DLQ]},
        {"topics": [DLQ, DLQ2], "pulsar_conn_id": "pulsar_other"},
        {"topics": [DLQ, DLQ2], "subscription": "other-sub"},
        {"topics": [DLQ, DLQ2], "poll_interval": 5},
    ):
        assert DlqBacklogEventTrigger(**other).shared_stream_key() != key, other


def test_two_watchers_share_one_poll_and_each_keeps_its_own_thresholds(monkeypatch):
    """Through the triggerer's SharedStreamManager: one backlog read per poll for both watchers."""
    from airflow.triggers.shared_stream import SharedStreamManager

    reads: list[int] = []

    async def fake_backlog(self, topics, subscription):
        reads.append(len(reads))
        return backlog(len(reads))  # 1, 2, 3, ...

    monkeypatch.setattr("airflow_provider_dlq.hooks.pulsar.PulsarHook.aget_backlog", fake_backlog)
    low = DlqBacklogEventTrigger(topics=[DLQ], min_backlog=2, poll_interval=0.01)
    high = DlqBacklogEventTrigger(topics=[DLQ], min_backlog=4, poll_interval=0.01)
    low.asset_state_store, high.asset_state_store = FakeStore(), FakeStore()
    assert low.shared_stream_key() == high.shared_stream_key()

    async def first_event(manager, trigger_id, trigger):
        stream = manager.subscribe(trigger_id=trigger_id, trigger=trigger, key=trigger.shared_stream_key())
        events = trigger.filter_shared_stream(stream)
        try:
            return (await asyncio.wait_for(events.__anext__(), timeout=10)).payload
        finally:
            await events.aclose()

    async def drive():
        manager = SharedStreamManager()
        return await asyncio.gather(first_event(manager, 1, low), first_event(manager, 2, high))

    fired_low, fired_high = asyncio.run(drive())
    assert fired_low["backlog"] == 2
    assert fired_high["backlog"] == 4
    # One poll fed both: had each polled on its own, reaching backlog 4 would have taken 6+ reads.
    assert 4 <= len(reads) <= 5
