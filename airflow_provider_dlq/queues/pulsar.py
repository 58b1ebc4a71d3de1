"""The ``pulsar`` scheme of ``MessageQueueTrigger``: a ``DlqBacklogEventTrigger``, never consuming
(``docs/event-driven.md``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.providers.common.messaging.providers.base_provider import BaseMessageQueueProvider

if TYPE_CHECKING:
    from airflow.triggers.base import BaseEventTrigger

QUEUE_PREFIX = "persistent://"


class PulsarMessageQueueProvider(BaseMessageQueueProvider):
    """Apache Pulsar DLQ backlog for ``MessageQueueTrigger`` (scheme ``pulsar``)."""

    scheme = "pulsar"

    def queue_matches(self, queue: str) -> bool:
        """The deprecated ``queue=`` form: ``persistent://tenant/namespace/topic``."""
        return queue.startswith(QUEUE_PREFIX) and len(queue[len(QUEUE_PREFIX) :].split("/")) == 3

    def trigger_class(self) -> type[BaseEventTrigger]:
        from airflow_provider_dlq.triggers.backlog_event import DlqBacklogEventTrigger

        return DlqBacklogEventTrigger

    def trigger_kwargs(self, queue: str, **kwargs: Any) -> dict[str, Any]:
        """For ``queue=``: the topic comes from the URI unless ``topics`` is given."""
        return {} if "topics" in kwargs else {"topics": [queue]}
