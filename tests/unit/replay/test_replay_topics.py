"""Topic names and the origin allowlist."""

from __future__ import annotations

import pytest

from pulsar_dlq_consumer.context import canonical_topic
from pulsar_dlq_consumer.topics import qualify_topic
from spark_apps.dlq_replay.errors import ReplayConfigError
from spark_apps.dlq_replay.topics import TopicMatcher


@pytest.mark.parametrize(
    ("topic", "qualified"),
    [
        ("orders", "persistent://public/default/orders"),
        ("acme/sales/orders", "persistent://acme/sales/orders"),
        ("persistent://acme/sales/orders", "persistent://acme/sales/orders"),
        ("non-persistent://a/b/c", "non-persistent://a/b/c"),
        ("", None),
        ("a/b", None),
        ("http://a/b/c", None),
        ("persistent://a/b/c d", None),
        ("persistent://a/b/c\n", None),
        ("persistent://a//c", None),
    ],
)
def test_qualify_topic(topic, qualified):
    assert qualify_topic(topic) == qualified


def test_republish_target_strips_the_partition_suffix():
    assert canonical_topic("orders-partition-2") == "persistent://public/default/orders"
    assert canonical_topic(None) is None
    assert canonical_topic("bad topic") is None


def test_globs_and_regexes():
    m = TopicMatcher.parse(["orders*", "persistent://acme/*/payments", "re:persistent://x/y/z[0-9]+"])
    assert m.matches("persistent://public/default/orders")
    assert m.matches("persistent://public/default/orders-eu")
    assert not m.matches("persistent://public/default/orders/evil")
    assert m.matches("persistent://acme/sales/payments")
    assert not m.matches("persistent://acme/sales/payments2")
    assert m.matches("persistent://x/y/z12")
    assert not m.matches("persistent://x/y/z")
    assert not m.matches(None)


def test_double_star_crosses_slashes():
    m = TopicMatcher.parse(["persistent://acme/**"])
    assert m.matches("persistent://acme/a/b")
    assert not m.matches("persistent://other/a/b")


def test_bad_patterns_name_the_option():
    with pytest.raises(ReplayConfigError, match="--origin-allowlist: invalid regular expression"):
        TopicMatcher.parse(["re:("])
    with pytest.raises(ReplayConfigError, match="empty pattern"):
        TopicMatcher.parse(["a", " "])


def test_leading_double_star_and_bad_shapes():
    m = TopicMatcher.parse(["**/payments*"])
    assert m.matches("persistent://acme/sales/payments-eu")
    assert not m.matches("persistent://acme/sales/orders")
    with pytest.raises(ReplayConfigError, match="must look like a topic name"):
        TopicMatcher.parse(["a/b"])
