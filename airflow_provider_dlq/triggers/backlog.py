"""``DlqBacklogTrigger``: wait, asynchronously, until DLQ topics hold enough pending messages."""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_dlq.hooks.backlog import (
    BacklogConfigError,
    BacklogReadError,
    TopicBacklog,
    split_topics,
)
from airflow_provider_dlq.hooks.connection import PulsarConnectionError
from airflow_provider_dlq.hooks.pulsar import PulsarHook

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping, Sequence

STATUS_SUCCESS = "success"
STATUS_TIMEOUT = "timeout"
STATUS_ERROR = "error"
#: Errors a next poll cannot fix (a missing connection, no admin or metrics URL, ``min_age`` without admin).
CONFIG_ERRORS = (PulsarConnectionError, BacklogConfigError)


def ready_topics(
    backlogs: Mapping[str, TopicBacklog], min_backlog: int, min_age_seconds: float | None
) -> list[str]:
    """Topics with at least ``min_backlog`` pending and, if given, the oldest ``min_age_seconds`` old."""
    if min_age_seconds is not None and any(item.source != "admin" for item in backlogs.values()):
        raise BacklogConfigError(
            "min_age needs the age of the oldest message, which only the Pulsar admin REST API "
            "reports; set the extra 'admin_url' on the connection, or drop min_age."
        )
    ready = []
    for topic, item in backlogs.items():
        if item.backlog < min_backlog:
            continue
        age = item.oldest_age_seconds
        if min_age_seconds is not None and (age is None or age < min_age_seconds):
            continue
        ready.append(topic)
    return ready


def topic_names(topics: str | Sequence[str]) -> list[str]:
    """``topics`` (a list or a comma-separated string) as a list; :class:`ValueError` when it names none."""
    names = split_topics(topics)
    if not names:
        raise ValueError(
            f"no DLQ topics given (topics={topics!r}); pass a list or a comma-separated string such as "
            "'persistent://public/default/orders-DLQ'."
        )
    return names


def as_xcom(backlogs: Mapping[str, TopicBacklog]) -> dict[str, dict[str, Any]]:
    """The sensor's XCom (and its trigger's event ``backlog``): each topic's backlog as a dict."""
    return {topic: asdict(item) for topic, item in backlogs.items()}


def topics_from_backlog(value: Mapping[str, Mapping[str, Any]] | None, min_backlog: int = 0) -> str:
    """The example DAGs' Jinja filter: a backlog XCom's topics with ``min_backlog`` pending, comma-joined."""
    return ",".join(t for t, item in sorted((value or {}).items()) if int(item["backlog"]) >= min_backlog)


class DlqBacklogTrigger(BaseTrigger):
    """Poll the backlog of ``subscription`` on ``topics`` (read-only) until it is ready or ``deadline`` (Unix
    time; ``None``: never) passes, then fire one ``success``, ``timeout`` or ``error`` event.

    .. seealso:: ``docs/sensor.md`` (the parameters as the sensor's, the events' keys)
    """

    def __init__(
        self,
        *,
        topics: Sequence[str],
        subscription: str,
        pulsar_conn_id: str = PulsarHook.default_conn_name,
        min_backlog: int = 1,
        min_age_seconds: float | None = None,
        poll_interval: float = 60.0,
        deadline: float | None = None,
    ) -> None:
        super().__init__()
        self.topics = list(topics)
        self.subscription = subscription
        self.pulsar_conn_id = pulsar_conn_id
        self.min_backlog = int(min_backlog)
        self.min_age_seconds = None if min_age_seconds is None else float(min_age_seconds)
        self.poll_interval = float(poll_interval)
        self.deadline = None if deadline is None else float(deadline)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        names = ("topics", "subscription", "pulsar_conn_id", "min_backlog", "min_age_seconds")
        kwargs = {name: getattr(self, name) for name in (*names, "poll_interval", "deadline")}
        return f"{type(self).__module__}.{type(self).__qualname__}", kwargs

    async def run(self) -> AsyncIterator[TriggerEvent]:
        last: Mapping[str, TopicBacklog] = {}
        args = (self.pulsar_conn_id, self.topics, self.subscription, self.poll_interval, self.deadline)
        async for poll in poll_backlog(*args):
            last_error: str | None = None
            try:
                if poll.error is not None:
                    raise poll.error
                last = poll.backlogs
                if ready := ready_topics(last, self.min_backlog, self.min_age_seconds):
                    yield TriggerEvent({"status": STATUS_SUCCESS, "backlog": as_xcom(last), "ready": ready})
                    return
                waiting = {t: b.backlog for t, b in last.items()}
                self.log.info("DLQ backlog not ready (need >= %s): %s", self.min_backlog, waiting)
            except CONFIG_ERRORS as exc:
                yield TriggerEvent({"status": STATUS_ERROR, "message": str(exc)})
                return
            except BacklogReadError as exc:
                last_error = str(exc)
                self.log.warning("Reading the DLQ backlog failed (will retry): %s", last_error)
            if self.deadline is not None and time.time() >= self.deadline:
                yield TriggerEvent(
                    {"status": STATUS_TIMEOUT, "backlog": as_xcom(last), "last_error": last_error}
                )
                return


@dataclass(frozen=True)
class BacklogPoll:
    """One read of the backlog: the backlog per topic and when, or the error of a failed read."""

    backlogs: Mapping[str, TopicBacklog]
    at: float
    error: Exception | None = None


async def poll_backlog(
    pulsar_conn_id: str,
    topics: Sequence[str],
    subscription: str,
    poll_interval: float,
    deadline: float | None = None,
) -> AsyncIterator[BacklogPoll]:
    """The backlog triggers' poll: a :class:`BacklogPoll` every ``poll_interval`` seconds (the last one at
    ``deadline``); a failed read is handed over in its poll, for the trigger to judge."""
    hook = PulsarHook(pulsar_conn_id)
    while True:
        try:
            poll = BacklogPoll(await hook.aget_backlog(topics, subscription), time.time())
        except Exception as exc:
            poll = BacklogPoll({}, time.time(), exc)
        yield poll
        wait = poll_interval if deadline is None else min(poll_interval, deadline - time.time())
        await asyncio.sleep(max(wait, 0.0))
