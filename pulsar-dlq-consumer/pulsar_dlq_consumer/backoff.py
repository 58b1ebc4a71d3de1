"""Negative-acknowledge redelivery backoff (PIP-106): ``next(redelivery_count) -> delay in seconds``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pulsar_dlq_consumer.delays import validate_delay
from pulsar_dlq_consumer.errors import ConfigurationError, InvalidDelayError


@runtime_checkable
class RedeliveryBackoff(Protocol):
    """A redelivery backoff policy: ``next(redelivery_count)`` (0 on the first delivery) -> seconds."""

    def next(self, redelivery_count: int) -> float:
        """Seconds to wait before the message is redelivered."""
        ...


def _check_seconds(name: str, value: float) -> float:
    return validate_delay(value, what=name, minimum=0, error=ConfigurationError)


@dataclass(frozen=True)
class ExponentialBackoff:
    """``min_delay * multiplier ** redelivery_count`` up to ``max_delay`` (MultiplierRedeliveryBackoff)."""

    min_delay: float = 1.0
    max_delay: float = 60.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if _check_seconds("min_delay", self.min_delay) > _check_seconds("max_delay", self.max_delay):
            raise ConfigurationError(
                f"min_delay ({self.min_delay!r} s) must not exceed max_delay ({self.max_delay!r} s)"
            )
        m = self.multiplier
        if isinstance(m, bool) or not isinstance(m, int | float) or not math.isfinite(m) or m < 1:
            raise ConfigurationError(f"multiplier must be a finite number >= 1; got {m!r}")

    def next(self, redelivery_count: int) -> float:
        count = max(0, int(redelivery_count))
        if self.min_delay == 0:
            return 0.0
        # Compare in log space so large counts never overflow.
        if count * math.log(self.multiplier) >= math.log(self.max_delay / self.min_delay):
            return float(self.max_delay)
        return float(min(self.max_delay, self.min_delay * self.multiplier**count))


@dataclass(frozen=True)
class ConstantBackoff:
    """The same delay after every failure (what a fixed ``negative_ack_redelivery_delay_ms`` gives)."""

    delay: float = 60.0

    def __post_init__(self) -> None:
        _check_seconds("delay", self.delay)

    def next(self, redelivery_count: int) -> float:
        return float(self.delay)


def checked_delay(backoff: RedeliveryBackoff, redelivery_count: int) -> float:
    """``backoff.next(redelivery_count)``; ``InvalidDelayError`` unless seconds in ``[0, 864000]``."""
    what = f"backoff policy {type(backoff).__name__}.next({redelivery_count})"
    try:
        value = backoff.next(redelivery_count)
    except Exception as exc:
        raise InvalidDelayError(f"{what} raised {exc!r}") from exc
    return validate_delay(value, what=what, minimum=0)
