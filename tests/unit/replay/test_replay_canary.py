"""Canary replay: options, per-group size, verdicts (pure), and the CLI contract."""

from __future__ import annotations

import pytest

from pulsar_dlq_consumer.replay_options import CanarySpec, ReplayOptionsError
from spark_apps.dlq_replay.canary import derived_retry_topics, verdicts, watched_topics
from spark_apps.dlq_replay.cli import parse_options

BASE = ["--run-id", "r", "--service-url", "pulsar://x:6650", "--topics", "o-s-DLQ", "--output-dir", "/o"]


def test_size_is_a_count_or_a_percentage_of_each_group():
    five, ten = CanarySpec.parse("5"), CanarySpec.parse(" 10 % ")
    assert (five.count, five.percent, five.label) == (5, None, "5")
    assert (ten.count, ten.percent, ten.label) == (None, 10.0, "10%")


@pytest.mark.parametrize(
    ("size", "kwargs", "says"),
    [
        ("five", {}, r"a count \(e.g. 5\) or a percentage"),
        ("0", {}, "integer >= 1"),
        ("150%", {}, r"percentage must be in \(0, 100\]"),
        ("5", {"wait_seconds": -1}, "wait-seconds must be >= 0"),
        ("5", {"max_failure_rate": 1.0}, r"max-failure-rate must be in \[0, 1\)"),
    ],
)
def test_bad_canary_options_name_the_fix(size, kwargs, says):
    with pytest.raises(ReplayOptionsError, match=says):
        CanarySpec.parse(size, **kwargs)


def test_cli_and_fingerprint():
    opts = parse_options(
        [*BASE, "--canary", "10%", "--canary-wait-seconds", "30", "--canary-max-failure-rate", "0.2"]
    )
    assert opts.canary == CanarySpec(percent=10.0, wait_seconds=30.0, max_failure_rate=0.2)
    assert opts.fingerprint_options("d")["canary"]["size"] == "10%"
    assert "canary" not in parse_options(BASE).fingerprint_options("d")


def test_verdict_halts_above_the_rate_and_without_evidence():
    spec = CanarySpec(count=4, max_failure_rate=0.25)
    got = verdicts({"a": ["1", "2", "3", "4"], "b": ["5", "6", "7", "8"], "c": []}, {"1", "2", "5"}, spec)
    assert got["a"] == {"canary_sent": 4, "failed_again": 2, "failure_rate": 0.5, "decision": "halted"}
    assert got["b"] == {"canary_sent": 4, "failed_again": 1, "failure_rate": 0.25, "decision": "replay"}
    assert got["c"]["decision"] == "halted"  # no canary could be published: no evidence, leave pending


def test_watched_topics_are_the_dlqs_and_their_retry_topics():
    spec = CanarySpec(count=1, watch_topics=("acme/orders/extra",))
    assert watched_topics(("o-s-DLQ",), spec) == [
        "persistent://public/default/o-s-DLQ",
        "persistent://public/default/o-s-RETRY",
        "persistent://acme/orders/extra",
    ]


def test_a_retry_topic_named_in_short_is_watched_not_derived():
    # Only the -RETRY siblings the run derived may be missing; one the user named must open.
    spec = CanarySpec(count=1, watch_topics=("a-s-RETRY",))
    topics = watched_topics(("o-s-DLQ", "a-s-DLQ"), spec)
    assert derived_retry_topics(topics, spec) == {"persistent://public/default/o-s-RETRY"}
