"""The one topic-name rule, shared by the library, the provider's hooks and the replay app."""

from __future__ import annotations

import pytest

from pulsar_dlq_consumer.errors import ConfigurationError
from pulsar_dlq_consumer.topics import normalize_topic, qualify_topic


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("orders-DLQ", "persistent://public/default/orders-DLQ"),
        ("acme/eu/orders", "persistent://acme/eu/orders"),
        ("persistent://acme/eu/orders-partition-3", "persistent://acme/eu/orders-partition-3"),
        ("non-persistent://acme/eu/orders", "non-persistent://acme/eu/orders"),
        ("a.b_c-d=e:f", "persistent://public/default/a.b_c-d=e:f"),
    ],
)
def test_names_are_qualified_as_the_pulsar_clients_do(given: str, expected: str) -> None:
    assert qualify_topic(given) == expected
    assert normalize_topic(given) == expected


@pytest.mark.parametrize(
    "given",
    [
        "",
        " x",
        "x ",
        "a/b",
        "a//c",
        "persistent://a/b",
        "http://a/b/c",
        "a/b/c/d",
        "or ders",
        "x\n",
        "x" * 1025,
    ],
)
def test_anything_else_is_not_a_topic_name(given: str) -> None:
    assert qualify_topic(given) is None
    with pytest.raises(ConfigurationError, match="topic name"):
        normalize_topic(given)


def test_a_dlq_can_be_required_to_be_persistent() -> None:
    assert normalize_topic("acme/eu/x-DLQ", persistent_only=True) == "persistent://acme/eu/x-DLQ"
    with pytest.raises(ConfigurationError, match="is not persistent"):
        normalize_topic("non-persistent://acme/eu/x-DLQ", persistent_only=True)
