"""The public API speaks pulsar-client's language, and only that: no former names remain."""

from __future__ import annotations

from typing import Any

import pulsar
import pytest

from pulsar_dlq_consumer import ConfigurationError, DeadLetterPolicy, DlqConsumer, RetryPolicy


def test_dead_letter_policy_takes_pulsar_client_argument_names_in_their_order() -> None:
    official = pulsar.ConsumerDeadLetterPolicy(3, "persistent://acme/shop/orders-DLQ", "replayer")
    ours = DeadLetterPolicy(3, "persistent://acme/shop/orders-DLQ", "replayer")
    assert (ours.max_redeliver_count, ours.dead_letter_topic, ours.initial_subscription_name) == (
        official.max_redeliver_count,
        official.dead_letter_topic,
        official.initial_subscription_name,
    )
    assert DeadLetterPolicy().max_redeliver_count == 16


def test_dead_letter_policy_has_no_former_names() -> None:
    with pytest.raises(TypeError, match="max_redeliveries"):
        DeadLetterPolicy(max_redeliveries=2)  # type: ignore[call-arg]
    policy = DeadLetterPolicy(2, "acme/shop/dlq", "r")
    for former in ("max_redeliveries", "topic", "initial_subscription"):
        assert not hasattr(policy, former)


class _FakePulsarConsumer:
    def __init__(self, topic: str, subscription: str, options: dict[str, Any]) -> None:
        self.topic, self.subscription, self.options = topic, subscription, options

    def consumer_name(self) -> str:
        return self.options.get("consumer_name") or "generated-name"

    def close(self) -> None:
        pass


class _FakeClient:
    """Records subscribe() calls; the wrapper needs nothing else until a message arrives."""

    def __init__(self) -> None:
        self.subscribed: list[_FakePulsarConsumer] = []

    def subscribe(self, topic: str, subscription: str, **options: Any) -> _FakePulsarConsumer:
        consumer = _FakePulsarConsumer(topic, subscription, options)
        self.subscribed.append(consumer)
        return consumer


def test_consumer_answers_to_pulsar_consumer_names() -> None:
    client = _FakeClient()
    with DlqConsumer(client, "orders", "billing", consumer_name="billing-1") as consumer:  # type: ignore[arg-type]
        assert consumer.topic() == "persistent://public/default/orders"
        assert consumer.subscription_name() == "billing"
        assert consumer.consumer_name() == "billing-1"
        assert type(consumer.topic()) is str
        assert not hasattr(consumer, "subscription")


def test_subscription_name_is_required_and_former_keywords_are_refused() -> None:
    client = _FakeClient()
    with pytest.raises(TypeError, match="subscription_name"):
        DlqConsumer(client, "orders")  # type: ignore[arg-type,call-arg]
    with DlqConsumer(
        client,  # type: ignore[arg-type]
        "orders",
        "billing",
        dead_letter_policy=DeadLetterPolicy(),
        retry_policy=RetryPolicy(),
    ) as consumer:
        assert consumer.dead_letter_topic == "persistent://public/default/orders-billing-DLQ"
        assert consumer.retry_topic == "persistent://public/default/orders-billing-RETRY"
        assert [c.topic for c in client.subscribed] == [consumer.topic(), consumer.retry_topic]


def test_a_pulsar_dead_letter_policy_is_refused_with_the_fix() -> None:
    official = pulsar.ConsumerDeadLetterPolicy(3)
    with pytest.raises(ConfigurationError, match=r"must be a pulsar_dlq_consumer\.DeadLetterPolicy"):
        DlqConsumer(_FakeClient(), "orders", "s", dead_letter_policy=official)  # type: ignore[arg-type]
