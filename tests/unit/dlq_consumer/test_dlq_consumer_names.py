"""The public API speaks pulsar-client's language; the former names warn for one release."""

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


def test_dead_letter_policy_former_names_warn_and_still_work() -> None:
    with pytest.warns(DeprecationWarning, match="is deprecated") as caught:
        policy = DeadLetterPolicy(max_redeliveries=2, topic="acme/shop/dlq", initial_subscription="r")  # type: ignore[call-arg]
    assert [str(w.message).split(" is deprecated")[0] for w in caught] == [
        "DeadLetterPolicy.max_redeliveries",
        "DeadLetterPolicy.topic",
        "DeadLetterPolicy.initial_subscription",
    ]
    assert policy == DeadLetterPolicy(2, "acme/shop/dlq", "r")
    with pytest.warns(DeprecationWarning, match="use dead_letter_topic"):
        assert policy.topic == "acme/shop/dlq"
    with pytest.warns(DeprecationWarning, match="use initial_subscription_name"):
        assert policy.initial_subscription == "r"
    with pytest.warns(DeprecationWarning, match="use max_redeliver_count"):
        assert policy.max_redeliveries == 2
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_redelivery'"):
        DeadLetterPolicy(max_redelivery=2)  # type: ignore[call-arg]


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
        # The former attribute use (a string, not called) keeps working for one release.
        assert consumer.topic == "persistent://public/default/orders"
        assert consumer.consumer_name.startswith("billing")
        with pytest.warns(DeprecationWarning, match=r"call subscription_name\(\)"):
            assert consumer.subscription == "billing"


def test_consumer_former_keyword_names_warn_and_still_work() -> None:
    client = _FakeClient()
    with pytest.warns(DeprecationWarning, match="is deprecated") as caught:
        consumer = DlqConsumer(
            client,  # type: ignore[arg-type]
            "orders",
            subscription="billing",
            dead_letter=DeadLetterPolicy(),
            retry=RetryPolicy(),
        )
    deprecated = {str(w.message).split("(")[1].split("=")[0] for w in caught}
    assert deprecated == {"subscription", "dead_letter", "retry"}
    with consumer:
        assert consumer.subscription_name() == "billing"
        assert consumer.dead_letter_topic == "persistent://public/default/orders-billing-DLQ"
        assert consumer.retry_topic == "persistent://public/default/orders-billing-RETRY"
        assert [c.topic for c in client.subscribed] == [consumer.topic(), consumer.retry_topic]
    with (
        pytest.warns(DeprecationWarning, match=r"dead_letter=\.\.\.\) is deprecated"),
        pytest.raises(ConfigurationError, match="give dead_letter_policy= only"),
    ):
        DlqConsumer(
            client,  # type: ignore[arg-type]
            "orders",
            "s",
            dead_letter_policy=DeadLetterPolicy(),
            dead_letter=DeadLetterPolicy(),
        )


def test_a_pulsar_dead_letter_policy_is_refused_with_the_fix() -> None:
    official = pulsar.ConsumerDeadLetterPolicy(3)
    with pytest.raises(ConfigurationError, match=r"must be a pulsar_dlq_consumer\.DeadLetterPolicy"):
        DlqConsumer(_FakeClient(), "orders", "s", dead_letter_policy=official)  # type: ignore[arg-type]
