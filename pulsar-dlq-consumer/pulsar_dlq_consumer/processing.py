"""A processing loop: run a handler per message and turn its outcome into ack, nack, retry or term."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from pulsar_dlq_consumer.errors import (
    ConfigurationError,
    DlqNotConfiguredError,
    InvalidDelayError,
    PublishError,
    RetryableError,
    RetryNotConfiguredError,
    TerminalError,
)

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable, Iterable

    import pulsar

    from pulsar_dlq_consumer.consumer import DlqConsumer

log = logging.getLogger(__name__)


class Outcome(StrEnum):
    """What happened to a message."""

    ACK = "ack"
    NACK = "nack"
    RETRY = "retry"
    TERM = "term"
    FAILED = "failed"  # the retry/DLQ write failed; the message was nacked and will be redelivered


@dataclass
class ProcessingStats:
    """Counts per outcome for one :meth:`MessageProcessor.run`."""

    received: int = 0
    acked: int = 0
    nacked: int = 0
    retried: int = 0
    termed: int = 0
    failed: int = 0

    def add(self, outcome: Outcome) -> None:
        self.received += 1
        field = {"ack": "acked", "nack": "nacked", "retry": "retried", "term": "termed"}.get(outcome, outcome)
        setattr(self, field, getattr(self, field) + 1)


def _check_classes(name: str, classes: Iterable[type[BaseException]]) -> tuple[type[BaseException], ...]:
    result = tuple(classes)
    if bad := [cls for cls in result if not (isinstance(cls, type) and issubclass(cls, Exception))]:
        raise ConfigurationError(
            f"{name} must be Exception subclasses (BaseException-only types such as KeyboardInterrupt "
            f"always propagate); got {bad[0]!r}"
        )
    return result


class MessageProcessor:
    """Run ``handler(msg)`` for each message of a :class:`DlqConsumer` and ack, term, retry or nack it by
    the outcome (docs/consumer-library.md); a ``BaseException`` that is no ``Exception`` propagates."""

    def __init__(
        self,
        consumer: DlqConsumer,
        handler: Callable[[pulsar.Message], Any],
        *,
        terminal: Iterable[type[BaseException]] = (),
        retryable: Iterable[type[BaseException]] = (),
        default: Outcome | str = Outcome.NACK,
    ) -> None:
        if not callable(handler):
            raise ConfigurationError(f"handler must be callable; got {handler!r}")
        if default not in (Outcome.NACK, Outcome.RETRY, Outcome.TERM):
            raise ConfigurationError(f"default must be 'nack', 'retry' or 'term'; got {default!r}")
        default = Outcome(default)
        if default is Outcome.RETRY and consumer.retry_policy is None:
            raise ConfigurationError(
                "default='retry' needs a consumer created with retry_policy=RetryPolicy(...)"
            )
        if default is Outcome.TERM and consumer.dead_letter_policy is None:
            raise ConfigurationError(
                "default='term' needs a consumer created with dead_letter_policy=DeadLetterPolicy(...)"
            )
        self.consumer = consumer
        self.handler = handler
        self.default = default
        self._terminal = _check_classes("terminal", (TerminalError, *terminal))
        self._retryable = _check_classes("retryable", (RetryableError, *retryable))

    def register_terminal(self, *classes: type[BaseException]) -> None:
        self._terminal += _check_classes("terminal", classes)

    def register_retryable(self, *classes: type[BaseException]) -> None:
        self._retryable += _check_classes("retryable", classes)

    def classify(self, error: Exception) -> Outcome:
        if isinstance(error, self._terminal):
            return Outcome.TERM
        if isinstance(error, self._retryable):
            return Outcome.RETRY
        return self.default

    def process(self, msg: pulsar.Message) -> Outcome:
        """Run the handler on ``msg`` and settle it; return the outcome."""
        try:
            self.handler(msg)
        except Exception as error:
            return self._settle_failure(msg, error)
        self.consumer.acknowledge(msg)
        return Outcome.ACK

    def _settle_failure(self, msg: pulsar.Message, error: Exception) -> Outcome:
        outcome = self.classify(error)
        log.info(
            "dlq_consumer: message %s from %s failed with %s: %s",
            msg.message_id(),
            msg.topic_name(),
            type(error).__name__,
            outcome.value,
        )
        try:
            if outcome is Outcome.TERM:
                self.consumer.term(msg, error)
            elif outcome is Outcome.RETRY:
                hint = error if isinstance(error, RetryableError) else RetryableError()
                self.consumer.reconsume_later(msg, hint.delay, level=hint.level, error=error)
            else:
                self.consumer.negative_acknowledge(msg, error)
        except PublishError:
            log.warning(
                "dlq_consumer: message %s could not be moved; it will be redelivered", msg.message_id()
            )
            return Outcome.FAILED
        except (DlqNotConfiguredError, RetryNotConfiguredError, InvalidDelayError) as misuse:
            self.consumer.negative_acknowledge(msg, error)
            raise misuse from error
        return outcome

    def run(
        self,
        *,
        max_messages: int | None = None,
        idle_timeout_s: float | None = None,
        receive_timeout_ms: int = 500,
        stop: threading.Event | None = None,
    ) -> ProcessingStats:
        """Process messages until ``max_messages``, ``idle_timeout_s`` idle or ``stop``; outcome counts."""
        import pulsar

        stats = ProcessingStats()
        last = time.monotonic()
        while not (stop is not None and stop.is_set()):
            if max_messages is not None and stats.received >= max_messages:
                break
            try:
                msg = self.consumer.receive(timeout_millis=receive_timeout_ms)
            except pulsar.Timeout:
                if idle_timeout_s is not None and time.monotonic() - last >= idle_timeout_s:
                    break
                continue
            except PublishError:
                # dead-lettering a message redelivered past the maximum failed; it was nacked
                log.warning("dlq_consumer: a message past max_redeliver_count could not be dead-lettered yet")
                stats.failed += 1
                continue
            last = time.monotonic()
            stats.add(self.process(msg))
        return stats
