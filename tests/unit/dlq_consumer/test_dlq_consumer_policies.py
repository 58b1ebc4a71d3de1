"""Pure logic: delay ladders, backoff policies, policy validation, the name guard, metrics, classification."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest

from pulsar_dlq_consumer import (
    ConfigurationError,
    ConstantBackoff,
    ConsumerMetrics,
    DeadLetterPolicy,
    DelayLevels,
    ExponentialBackoff,
    InvalidDelayError,
    MessageProcessor,
    Outcome,
    RetryableError,
    RetryPolicy,
    TerminalError,
    TopicNameGuard,
    TopicNameGuardError,
)
from pulsar_dlq_consumer.backoff import checked_delay
from pulsar_dlq_consumer.delays import DEFAULT_LEVELS, parse_duration, validate_delay
from pulsar_dlq_consumer.metrics import topic_attributes
from pulsar_dlq_consumer.policy import normalize_topic, resolve_topics

# --------------------------------------------------------------------------- delays


def test_default_ladder_is_the_tdmq_ladder() -> None:
    assert DEFAULT_LEVELS.describe() == "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    assert len(DEFAULT_LEVELS.delays) == 18
    assert DEFAULT_LEVELS.delay_for_level(1) == 1
    assert DEFAULT_LEVELS.delay_for_level(3) == 10
    assert DEFAULT_LEVELS.delay_for_level(18) == 7200
    assert [DEFAULT_LEVELS.level_for_retry(n) for n in (0, 1, 2, 18, 19, 500)] == [1, 1, 2, 18, 18, 18]


@pytest.mark.parametrize(
    ("text", "seconds"), [("1s", 1), ("1500ms", 1.5), ("2m", 120), ("1h", 3600), ("10d", 864000), (" 5s ", 5)]
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5", "5 s", "-1s", "1w", "s", "1e3s"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(InvalidDelayError, match="number and a unit"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("delay", "ok"),
    [
        (1, True),
        (864_000, True),
        (timedelta(days=10), True),
        (0.999, False),
        (864_000.5, False),
        (math.inf, False),
        (math.nan, False),
        (True, False),
        ("5", False),
        (None, False),
        (timedelta(seconds=-5), False),
    ],
)
def test_validate_delay_range(delay: object, ok: bool) -> None:
    if ok:
        assert 1 <= validate_delay(delay) <= 864_000  # type: ignore[arg-type]
    else:
        with pytest.raises(InvalidDelayError):
            validate_delay(delay)  # type: ignore[arg-type]


def test_custom_ladder_and_errors() -> None:
    ladder = DelayLevels.parse(["2s", 30, timedelta(minutes=5)])
    assert ladder.delays == (2.0, 30.0, 300.0)
    assert ladder.describe() == "2s 30s 5m"
    with pytest.raises(InvalidDelayError, match="from 1 to 3"):
        ladder.delay_for_level(4)
    with pytest.raises(ConfigurationError, match="at least one"):
        DelayLevels.parse("")
    with pytest.raises(ConfigurationError, match="delay level 2 must be between 1 s and 864000 s"):
        DelayLevels.parse("1s 11d")
    with pytest.raises(ConfigurationError, match="delay level 2 must be between"):
        DelayLevels.parse("1s 500ms")


def test_retry_policy_resolution() -> None:
    policy = RetryPolicy(delay_levels="1s 5s 10s")
    assert [policy.resolve_delay(n) for n in (1, 2, 3, 4)] == [1, 5, 10, 10]  # level increment
    assert policy.resolve_delay(1, level=3) == 10
    assert policy.resolve_delay(2, level="increment") == 5
    assert policy.resolve_delay(1, delay=timedelta(minutes=2)) == 120
    fixed = RetryPolicy(level_increment=False, default_delay=42)
    assert fixed.resolve_delay(7) == 42
    with pytest.raises(InvalidDelayError, match="not both"):
        policy.resolve_delay(1, delay=5, level=1)
    with pytest.raises(InvalidDelayError, match="from 1 to 3"):
        policy.resolve_delay(1, level=True)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_reconsumes": 0}, "max_reconsumes must be an int >= 1"),
        ({"max_reconsumes": 2.5}, "max_reconsumes"),
        ({"default_delay": 0}, "default_delay must be between"),
        ({"delay_levels": "1s 2x"}, "invalid delay ladder"),
        ({"topic": "a/b"}, "not a valid topic name"),
    ],
)
def test_retry_policy_validation(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_redeliver_count": -1}, "max_redeliver_count must be an int >= 0"),
        ({"max_redeliver_count": True}, "max_redeliver_count"),
        ({"initial_subscription_name": " "}, "initial_subscription_name"),
        ({"name_guard": "dlq."}, "TopicNameGuard"),
        ({"max_error_message_bytes": 10}, "max_error_message_bytes"),
        ({"dead_letter_topic": "http://x/y/z"}, "persistent://tenant/namespace/topic"),
    ],
)
def test_dead_letter_policy_validation(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        DeadLetterPolicy(**kwargs)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- names and guard


def test_default_names_and_normalisation() -> None:
    assert resolve_topics("orders", "billing", DeadLetterPolicy(), RetryPolicy()) == (
        "persistent://public/default/orders",
        "persistent://public/default/orders-billing-DLQ",
        "persistent://public/default/orders-billing-RETRY",
    )
    assert normalize_topic("acme/eu/orders") == "persistent://acme/eu/orders"
    assert normalize_topic("non-persistent://acme/eu/orders") == "non-persistent://acme/eu/orders"
    for bad in ["", " x", "a/b", "persistent://a/b", "a//c"]:
        with pytest.raises(ConfigurationError):
            normalize_topic(bad)
    with pytest.raises(ConfigurationError, match="subscription"):
        resolve_topics("orders", "", None, None)


@pytest.mark.parametrize(
    ("guard", "topic", "refused"),
    [
        (TopicNameGuard(), "persistent://public/default/__change_events", "internal"),
        (TopicNameGuard(allow_internal=True), "persistent://public/default/__x", None),
        (TopicNameGuard(required_prefix="dlq."), "persistent://public/default/orders-s-DLQ", "starting with"),
        (TopicNameGuard(required_prefix="dlq."), "persistent://public/default/dlq.orders", None),
        (TopicNameGuard(pattern=r"persistent://acme/dlq/.+"), "persistent://public/default/x", "pattern"),
        (TopicNameGuard(pattern=r"persistent://acme/dlq/.+"), "persistent://acme/dlq/x", None),
    ],
)
def test_name_guard(guard: TopicNameGuard, topic: str, refused: str | None) -> None:
    if refused is None:
        guard.check(topic, role="DLQ")
    else:
        with pytest.raises(TopicNameGuardError, match=refused):
            guard.check(topic, role="DLQ")


def test_name_guard_validates_itself() -> None:
    with pytest.raises(ConfigurationError, match="regular expression"):
        TopicNameGuard(pattern="(")
    with pytest.raises(ConfigurationError, match="required_prefix"):
        TopicNameGuard(required_prefix="")


# --------------------------------------------------------------------------- backoff


def test_exponential_backoff_follows_pip106() -> None:
    backoff = ExponentialBackoff()
    assert [backoff.next(n) for n in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert backoff.next(10_000) == 60  # no overflow
    assert ExponentialBackoff(0.5, 10, 3).next(2) == 4.5
    assert ExponentialBackoff(0, 10).next(5) == 0
    assert ConstantBackoff(3).next(99) == 3


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"min_delay": -1}, "min_delay"),
        ({"min_delay": 5, "max_delay": 1}, "must not exceed"),
        ({"multiplier": 0.5}, "multiplier"),
        ({"max_delay": math.inf}, "max_delay"),
        ({"max_delay": 10**7}, "between 0 s and 864000 s"),
    ],
)
def test_backoff_validation(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        ExponentialBackoff(**kwargs)


def test_user_backoff_is_checked() -> None:
    class Fibonacci:
        def next(self, redelivery_count: int) -> float:
            a, b = 1, 1
            for _ in range(redelivery_count):
                a, b = b, a + b
            return float(a)

    assert [checked_delay(Fibonacci(), n) for n in range(5)] == [1, 1, 2, 3, 5]

    class Broken:
        def next(self, redelivery_count: int) -> float:
            return -1.0

    class Raises:
        def next(self, redelivery_count: int) -> float:
            raise RuntimeError("oops")

    with pytest.raises(InvalidDelayError, match=r"Broken.next\(0\) must be between 0 s"):
        checked_delay(Broken(), 0)
    with pytest.raises(InvalidDelayError, match="raised"):
        checked_delay(Raises(), 0)


# --------------------------------------------------------------------------- metrics


class _Recorder:
    def __init__(self) -> None:
        self.points: list[tuple[str, int, dict[str, str]]] = []

    def get_meter(self, name: str, *a: object, **k: object) -> _Recorder:
        self.meter_name = name
        return self

    def create_counter(self, name: str, unit: str = "", description: str = "") -> object:
        recorder = self

        class Counter:
            def add(self, amount: int, attributes: dict[str, str] | None = None) -> None:
                recorder.points.append((name, amount, dict(attributes or {})))

        return Counter()


def test_metrics_names_and_attributes() -> None:
    recorder = _Recorder()
    metrics = ConsumerMetrics(recorder)  # type: ignore[arg-type]
    attrs = topic_attributes("persistent://acme/eu/orders", "billing")
    assert attrs == {
        "topic": "persistent://acme/eu/orders",
        "subscription": "billing",
        "pulsar_tenant": "acme",
        "pulsar_namespace": "acme/eu",
    }
    metrics.terms.add(1, attrs)
    metrics.dlq_messages.add(1, {**attrs, "reason": "term"})
    metrics.retries.add(1, attrs)
    metrics.nacks.add(1, attrs)
    assert [p[0] for p in recorder.points] == [
        "pulsar_client_consumer_terms",
        "pulsar_client_consumer_dlq_messages",
        "pulsar_client_consumer_retries",
        "pulsar_client_consumer_nacks",
    ]
    assert recorder.points[1][2]["reason"] == "term"
    assert recorder.meter_name == "pulsar_dlq_consumer"
    ConsumerMetrics().terms.add(1, attrs)  # the global (no-op) provider works without an SDK


# --------------------------------------------------------------------------- classification (fake consumer)


class _FakeConsumer:
    """Records what the processor asks of the consumer (pure logic, no broker)."""

    def __init__(self, *, dlq: bool = True, retry: bool = True) -> None:
        self.dead_letter_policy = DeadLetterPolicy() if dlq else None
        self.retry_policy = RetryPolicy() if retry else None
        self.calls: list[tuple[str, object]] = []

    def acknowledge(self, msg: object) -> None:
        self.calls.append(("ack", None))

    def negative_acknowledge(self, msg: object, error: object = None) -> None:
        self.calls.append(("nack", type(error).__name__))

    def term(self, msg: object, error: object = None) -> None:
        self.calls.append(("term", type(error).__name__))

    def reconsume_later(
        self, msg: object, delay: object = None, *, level: object = None, error: object = None
    ) -> None:
        self.calls.append(("retry", (delay, level)))


class _Msg:
    def message_id(self) -> str:
        return "(1,2,-1,-1)"

    def topic_name(self) -> str:
        return "t"


class Custom(Exception):
    pass


class CustomChild(Custom):
    pass


@pytest.mark.parametrize(
    ("error", "expected_call"),
    [
        (None, ("ack", None)),
        (TerminalError("x"), ("term", "TerminalError")),
        (CustomChild("x"), ("term", "CustomChild")),
        (RetryableError("x", level=4), ("retry", (None, 4))),
        (RetryableError("x", delay=timedelta(seconds=9)), ("retry", (timedelta(seconds=9), None))),
        (TimeoutError("x"), ("retry", (None, None))),
        (ValueError("x"), ("nack", "ValueError")),
    ],
)
def test_classification(error: Exception | None, expected_call: tuple[str, object]) -> None:
    fake = _FakeConsumer()

    def handler(msg: object) -> None:
        if error is not None:
            raise error

    processor = MessageProcessor(fake, handler, terminal=[Custom], retryable=[TimeoutError])  # type: ignore[arg-type]
    outcome = processor.process(_Msg())
    assert fake.calls == [expected_call]
    assert outcome.value == {"ack": "ack", "term": "term", "retry": "retry", "nack": "nack"}[expected_call[0]]


def test_processor_validation() -> None:
    with pytest.raises(ConfigurationError, match="Exception subclasses"):
        MessageProcessor(_FakeConsumer(), lambda m: None, terminal=[KeyboardInterrupt])  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="default='retry' needs"):
        MessageProcessor(_FakeConsumer(retry=False), lambda m: None, default="retry")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="default='term' needs"):
        MessageProcessor(_FakeConsumer(dlq=False), lambda m: None, default=Outcome.TERM)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="'nack', 'retry' or 'term'"):
        MessageProcessor(_FakeConsumer(), lambda m: None, default="ack")  # type: ignore[arg-type]
    with pytest.raises(InvalidDelayError, match="not both"):
        RetryableError("x", delay=1, level=1)
