"""The ``pulsar`` scheme of Airflow's common-messaging ``MessageQueueTrigger``: event-driven DLQ replay.

.. code-block:: python

    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
    from airflow.sdk import Asset, AssetWatcher

    trigger = MessageQueueTrigger(
        scheme="pulsar",
        topics=["persistent://public/default/orders-order-service-DLQ"],
        subscription="dlq-replayer",
        min_backlog=100,
        max_age_seconds=900,
    )
    dlq_backlog = Asset("pulsar_dlq_backlog", watchers=[AssetWatcher(name="dlq_watcher", trigger=trigger)])

The keyword arguments are those of
:class:`~airflow_provider_dlq.triggers.backlog_event.DlqBacklogEventTrigger`. Unlike the queue schemes of
other providers, this one never consumes: it watches a subscription's backlog and fires once per
backlog until a replay has run. See ``docs/event-driven.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.providers.common.messaging.providers.base_provider import BaseMessageQueueProvider

if TYPE_CHECKING:
    from airflow.triggers.base import BaseEventTrigger

#: Topic URIs the deprecated ``MessageQueueTrigger(queue=...)`` form recognises as Pulsar topics.
QUEUE_PREFIX = "persistent://"


class PulsarMessageQueueProvider(BaseMessageQueueProvider):
    """Apache Pulsar DLQ backlog for ``MessageQueueTrigger`` (scheme ``pulsar``)."""

    scheme = "pulsar"

    def queue_matches(self, queue: str) -> bool:
        """The deprecated ``queue=`` form: a Pulsar topic URI, ``persistent://tenant/namespace/topic``."""
        return queue.startswith(QUEUE_PREFIX) and len(queue[len(QUEUE_PREFIX) :].split("/")) == 3

    def trigger_class(self) -> type[BaseEventTrigger]:
        from airflow_provider_dlq.triggers.backlog_event import DlqBacklogEventTrigger

        return DlqBacklogEventTrigger

    def trigger_kwargs(self, queue: str, **kwargs: Any) -> dict[str, Any]:
        """For ``queue=``: the topic comes from the URI unless ``topics`` is given."""
        return {} if "topics" in kwargs else {"topics": [queue]}
