"""Errors raised by the consumer library, and the exceptions handlers raise to choose an outcome."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from datetime import timedelta


class DlqConsumerError(Exception):
    """Base class of every error this library raises."""


class ConfigurationError(DlqConsumerError, ValueError):
    """A policy or consumer argument is invalid; the message names the argument and the fix."""


class TopicNameGuardError(ConfigurationError):
    """A DLQ or retry topic name was refused by the name guard (prefix, pattern or internal name)."""


class UnsupportedSubscriptionTypeError(ConfigurationError):
    """Retry topics and dead-lettering need a Shared or Key_Shared subscription."""


class InvalidDelayError(DlqConsumerError, ValueError):
    """A retry delay or delay level is out of range, or a backoff policy returned a bad delay."""


class DlqNotConfiguredError(DlqConsumerError):
    """``term`` (or dead-lettering) was requested on a consumer without a dead-letter policy."""


class RetryNotConfiguredError(DlqConsumerError):
    """``reconsume_later`` was called on a consumer without a retry policy."""


class PublishError(DlqConsumerError):
    """Producing to the retry or DLQ topic failed: the original was nacked, not acknowledged."""


class ConsumerClosedError(DlqConsumerError):
    """The consumer wrapper was used after ``close()``."""


class TerminalError(Exception):
    """Raise from a handler to send the message straight to the DLQ (``term``), skipping retries."""


class RetryableError(Exception):
    """Raise from a handler to retry the message after ``delay`` or ``level`` (neither: the policy's)."""

    def __init__(
        self, *args: object, delay: float | timedelta | None = None, level: int | None = None
    ) -> None:
        super().__init__(*args)
        if delay is not None and level is not None:
            raise InvalidDelayError("give RetryableError either delay= or level=, not both")
        self.delay = delay
        self.level = level
