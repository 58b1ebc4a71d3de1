"""Dead-letter and retry policies, validated eagerly, and the DLQ/retry topic name guard (KIP-1191 style)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from pulsar_dlq_consumer.conventions import MAX_ERROR_MESSAGE_BYTES, MAX_ERROR_STACK_BYTES
from pulsar_dlq_consumer.delays import DEFAULT_LEVELS, DelayLevels, validate_delay
from pulsar_dlq_consumer.errors import ConfigurationError, InvalidDelayError, TopicNameGuardError
from pulsar_dlq_consumer.topics import normalize_topic

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import timedelta

LEVEL_INCREMENT: Literal["increment"] = "increment"


@dataclass(frozen=True)
class TopicNameGuard:
    """Refuse unsafe DLQ and retry topic names, as KIP-1191 (the parameters: docs/consumer-library.md)."""

    required_prefix: str | None = None
    pattern: str | None = None
    allow_internal: bool = False

    def __post_init__(self) -> None:
        _check_optional_name("required_prefix", self.required_prefix)
        if self.pattern is not None:
            try:
                re.compile(self.pattern)
            except (re.error, TypeError) as exc:
                raise ConfigurationError(
                    f"pattern {self.pattern!r} is not a valid regular expression: {exc}"
                ) from None

    def check(self, topic: str, *, role: str) -> None:
        """Raise :class:`TopicNameGuardError` naming ``role`` (``DLQ``/``retry``) if ``topic`` is refused."""
        name = topic.rsplit("/", 1)[-1]
        if name.startswith("__") and not self.allow_internal:
            raise TopicNameGuardError(
                f"{role} topic {topic!r} is an internal name (starts with '__'); choose another name"
            )
        if self.required_prefix is not None and not name.startswith(self.required_prefix):
            raise TopicNameGuardError(
                f"{role} topic {topic!r} must have a local name starting with {self.required_prefix!r} "
                f"(name guard); set the topic explicitly, e.g. '{topic.rsplit('/', 1)[0]}/"
                f"{self.required_prefix}{name}'"
            )
        if self.pattern is not None and re.fullmatch(self.pattern, topic) is None:
            raise TopicNameGuardError(
                f"{role} topic {topic!r} does not match the required pattern {self.pattern!r}"
            )


def _check_optional_name(name: str, value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ConfigurationError(f"{name} must be a non-empty string or None; got {value!r}")


def check_count(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"{name} must be an int >= {minimum}; got {value!r}")


@dataclass(frozen=True)
class DeadLetterPolicy:
    """Where and how failed messages are dead-lettered (the parameters: docs/consumer-library.md)."""

    max_redeliver_count: int = 16
    dead_letter_topic: str | None = None
    initial_subscription_name: str | None = None
    name_guard: TopicNameGuard = field(default_factory=TopicNameGuard)
    copy_payload: bool = True
    include_stacktrace: bool = True
    max_error_message_bytes: int = MAX_ERROR_MESSAGE_BYTES
    max_stacktrace_bytes: int = MAX_ERROR_STACK_BYTES

    def __post_init__(self) -> None:
        check_count("max_redeliver_count", self.max_redeliver_count, 0)
        if self.dead_letter_topic is not None:
            normalize_topic(self.dead_letter_topic)
        _check_optional_name("initial_subscription_name", self.initial_subscription_name)
        if not isinstance(self.name_guard, TopicNameGuard):
            raise ConfigurationError(f"name_guard must be a TopicNameGuard; got {self.name_guard!r}")
        check_count("max_error_message_bytes", self.max_error_message_bytes, 64)
        check_count("max_stacktrace_bytes", self.max_stacktrace_bytes, 64)


@dataclass(frozen=True)
class RetryPolicy:
    """Retry through a retry topic with delayed delivery, as Java ``enableRetry``/TDMQ ``reconsumeLater``."""

    max_reconsumes: int = 16
    topic: str | None = None
    delay_levels: DelayLevels | str | Sequence[str | float | timedelta] = DEFAULT_LEVELS
    level_increment: bool = True
    default_delay: float | timedelta = 60.0

    def __post_init__(self) -> None:
        check_count("max_reconsumes", self.max_reconsumes, 1)
        if self.topic is not None:
            normalize_topic(self.topic)
        if not isinstance(self.delay_levels, DelayLevels):
            object.__setattr__(self, "delay_levels", DelayLevels.parse(self.delay_levels))
        validate_delay(self.default_delay, what="default_delay", error=ConfigurationError)

    def resolve_delay(
        self,
        reconsume_times: int,
        *,
        delay: float | timedelta | None = None,
        level: int | Literal["increment"] | None = None,
    ) -> float:
        """Seconds to delay the ``reconsume_times``-th retry (1-based), else ``InvalidDelayError``."""
        if delay is not None and level is not None:
            raise InvalidDelayError("give reconsume_later either delay= or level=, not both")
        if delay is not None:
            return validate_delay(delay)
        levels = self.delay_levels
        assert isinstance(levels, DelayLevels)  # __post_init__ parsed it
        if level == LEVEL_INCREMENT or (level is None and self.level_increment):
            return levels.delay_for_level(levels.level_for_retry(reconsume_times))
        if level is not None:
            return levels.delay_for_level(level)
        return validate_delay(self.default_delay, what="default_delay")


def resolve_topics(
    topic: str, subscription: str, dead_letter: DeadLetterPolicy | None, retry: RetryPolicy | None
) -> tuple[str, str | None, str | None]:
    """The topic, DLQ topic and retry topic (``None`` without its policy), defaulted and name-guarded."""
    full = normalize_topic(topic)
    if not isinstance(subscription, str) or not subscription.strip():
        raise ConfigurationError(f"subscription must be a non-empty string; got {subscription!r}")
    if retry is not None and dead_letter is None:
        raise ConfigurationError(
            "a retry policy needs a dead-letter policy (past max_reconsumes the message goes to the DLQ): "
            "pass dead_letter_policy=DeadLetterPolicy(...)"
        )
    dlq = retry_topic = None
    if dead_letter is not None:
        named = dead_letter.dead_letter_topic
        dlq = normalize_topic(named) if named else f"{full}-{subscription}-DLQ"
        dead_letter.name_guard.check(dlq, role="DLQ")
        if retry is not None:
            retry_topic = normalize_topic(retry.topic) if retry.topic else f"{full}-{subscription}-RETRY"
            dead_letter.name_guard.check(retry_topic, role="retry")
    names = [n for n in (full, dlq, retry_topic) if n is not None]
    if len(set(names)) != len(names):
        raise ConfigurationError(
            "topic, DLQ topic and retry topic must all differ; "
            f"got topic={full!r}, dlq={dlq!r}, retry={retry_topic!r}"
        )
    return full, dlq, retry_topic
