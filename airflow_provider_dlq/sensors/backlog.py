"""``DlqBacklogSensor``: succeed when DLQ topics hold pending messages; skip cleanly when they do not."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowSensorTimeout, AirflowSkipException

from airflow_provider_dlq.hooks.backlog import BacklogReadError
from airflow_provider_dlq.hooks.pulsar import PulsarHook
from airflow_provider_dlq.triggers.backlog import (
    STATUS_ERROR,
    STATUS_TIMEOUT,
    DlqBacklogTrigger,
    as_xcom,
    ready_topics,
    topic_names,
)
from pulsar_dlq_consumer.replay_options import DEFAULT_SUBSCRIPTION

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from airflow.sdk import Context


class DlqBacklogSensor(BaseSensorOperator):
    """Wait until the replayer subscription has a backlog on one or more DLQ topics; return every watched
    topic's backlog as XCom. A backlog that could not be read fails the task, even with ``soft_fail``.

    :param topics: DLQ topics: a list or a comma-separated string; names or globs over a namespace such
        as ``persistent://acme/orders/*-DLQ``. (templated)
    :param subscription: The subscription whose backlog counts (default ``dlq-replayer``). (templated)
    :param pulsar_conn_id: The ``pulsar`` connection (default ``pulsar_default``).
    :param min_backlog: Pending messages a topic needs to be ready (default 1).
    :param min_age: Optional minimum age of the oldest pending message (seconds or timedelta); needs
        an admin URL.
    :param poll_interval: Seconds between backlog reads (default 60).
    :param deferrable: Wait in the triggerer (default) instead of holding a worker slot.
    :param timeout: Give up after this many seconds (inherited); with ``soft_fail`` the task is skipped.

    .. seealso:: ``docs/sensor.md``
    """

    template_fields: Sequence[str] = ("topics", "subscription")
    ui_color = "#e8f4e8"

    def __init__(
        self,
        *,
        topics: str | Sequence[str],
        subscription: str = DEFAULT_SUBSCRIPTION,
        pulsar_conn_id: str = PulsarHook.default_conn_name,
        min_backlog: int = 1,
        min_age: timedelta | float | None = None,
        poll_interval: timedelta | float = 60.0,
        deferrable: bool = True,
        **kwargs: Any,
    ) -> None:
        if "poke_interval" in kwargs:
            raise TypeError("DlqBacklogSensor uses poll_interval (for both modes); drop poke_interval.")
        interval = poll_interval.total_seconds() if isinstance(poll_interval, timedelta) else poll_interval
        if not isinstance(interval, (int, float)) or interval <= 0:
            raise ValueError(f"poll_interval must be a positive number of seconds; got {poll_interval!r}.")
        super().__init__(poke_interval=float(interval), **kwargs)
        if isinstance(min_backlog, bool) or not isinstance(min_backlog, int) or min_backlog < 1:
            raise ValueError(f"min_backlog must be an integer >= 1; got {min_backlog!r}.")
        age = min_age.total_seconds() if isinstance(min_age, timedelta) else min_age
        if age is not None and (not isinstance(age, (int, float)) or age < 0):
            raise ValueError(
                f"min_age must be a non-negative number of seconds or a timedelta; got {min_age!r}."
            )
        self.topics = topics
        self.subscription = subscription
        self.pulsar_conn_id = pulsar_conn_id
        self.min_backlog = min_backlog
        self.min_age_seconds: float | None = None if age is None else float(age)
        self.poll_interval = float(interval)
        self.deferrable = deferrable
        self._last_read_error: str | None = None

    @property
    def topic_list(self) -> list[str]:
        try:
            return topic_names(self.topics)
        except ValueError as exc:
            raise ValueError(f"{self.task_id}: {exc}") from None

    def execute(self, context: Context) -> Any:
        if self.deferrable:
            # The trigger enforces the deadline itself (and reports the last reading); the defer timeout
            # is only a backstop in case the triggerer loses the trigger.
            self.defer(
                trigger=DlqBacklogTrigger(
                    topics=self.topic_list,
                    subscription=self.subscription,
                    pulsar_conn_id=self.pulsar_conn_id,
                    min_backlog=self.min_backlog,
                    min_age_seconds=self.min_age_seconds,
                    poll_interval=self.poll_interval,
                    deadline=time.time() + self.timeout,
                ),
                method_name="execute_complete",
                timeout=timedelta(seconds=self.timeout + 2 * self.poll_interval + 60),
            )
        try:
            return super().execute(context)
        except (AirflowSkipException, AirflowSensorTimeout):
            if self._last_read_error:
                raise self._read_failed(self._last_read_error) from None
            raise

    def _read_failed(self, error: str) -> BacklogReadError:
        return BacklogReadError(f"{self.task_id}: timed out and the last backlog read failed: {error}")

    def poke(self, context: Context) -> PokeReturnValue:
        hook = PulsarHook(self.pulsar_conn_id)
        try:
            backlogs = hook.get_backlog(self.topic_list, self.subscription)
        except BacklogReadError as exc:
            self._last_read_error = str(exc)
            self.log.warning("Reading the DLQ backlog failed (will retry): %s", exc)
            return PokeReturnValue(is_done=False)
        self._last_read_error = None
        ready = ready_topics(backlogs, self.min_backlog, self.min_age_seconds)
        xcom = as_xcom(backlogs)
        self._log_backlog(xcom, ready)
        return PokeReturnValue(is_done=bool(ready), xcom_value=xcom)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        if event["status"] == STATUS_ERROR:
            # A configuration error: fail (never soft-fail), the message names the fix.
            raise ValueError(f"{self.task_id}: {event['message']}")
        if event["status"] == STATUS_TIMEOUT:
            if event["last_error"]:
                raise self._read_failed(event["last_error"])
            seen = {t: b["backlog"] for t, b in event["backlog"].items()}
            raise AirflowSensorTimeout(
                f"{self.task_id}: no DLQ topic reached a backlog of {self.min_backlog}"
                f"{f' aged {self.min_age_seconds:g}s' if self.min_age_seconds is not None else ''} "
                f"within {self.timeout:g}s on subscription {self.subscription!r}; last backlog: {seen}"
            )
        self._log_backlog(event["backlog"], event["ready"])
        return event["backlog"]

    def _log_backlog(self, backlogs: Mapping[str, Mapping[str, Any]], ready: Sequence[str]) -> None:
        for topic, item in sorted(backlogs.items()):
            oldest = item["oldest_age_seconds"]
            self.log.info(
                "%s %s: backlog %d %s%s (%s%s)",
                "READY  " if topic in ready else "waiting",
                topic,
                item["backlog"],
                "messages" if item["exact"] else "entries",
                "" if oldest is None else f", oldest {oldest:.0f}s",
                item["source"],
                "" if item["found"] else ", subscription not found yet",
            )
