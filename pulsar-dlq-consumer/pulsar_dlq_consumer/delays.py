"""Retry delays: arbitrary delays (1 s to 864,000 s) and TDMQ-style delay levels with level increment."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from pulsar_dlq_consumer.errors import ConfigurationError, InvalidDelayError

if TYPE_CHECKING:
    from collections.abc import Sequence

MIN_DELAY_SECONDS = 1.0
MAX_DELAY_SECONDS = 864_000.0  # 10 days, the range of Pulsar delayed delivery used by TDMQ
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"(?P<num>\d+(?:\.\d+)?)(?P<unit>ms|s|m|h|d)")


def parse_duration(text: str) -> float:
    """Parse ``"500ms"``, ``"5s"``, ``"2m"``, ``"1h"`` or ``"1d"`` into seconds (or ``InvalidDelayError``)."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise InvalidDelayError(
            f"cannot parse delay {text!r}: write a number and a unit (ms, s, m, h, d), e.g. '5s' or '2m'"
        )
    return float(match.group("num")) * _UNITS[match.group("unit")]


def validate_delay(
    delay: float | timedelta,
    *,
    what: str = "delay",
    minimum: float = MIN_DELAY_SECONDS,
    error: type[ValueError] = InvalidDelayError,
) -> float:
    """``delay`` in seconds, checked to be within ``minimum`` (1 s) to 864,000 s (else ``error``)."""
    if isinstance(delay, timedelta):
        seconds = delay.total_seconds()
    elif isinstance(delay, int | float) and not isinstance(delay, bool):
        seconds = float(delay)
    else:
        raise error(f"{what} must be seconds (int/float) or a timedelta; got {delay!r}")
    if not math.isfinite(seconds) or not minimum <= seconds <= MAX_DELAY_SECONDS:
        raise error(
            f"{what} must be between {minimum:g} s and {MAX_DELAY_SECONDS:g} s (10 days); got {seconds!r} s"
        )
    return seconds


@dataclass(frozen=True)
class DelayLevels:
    """A ladder of retry delays by 1-based level (TDMQ ``MESSAGE_DELAYLEVEL``); the last level repeats."""

    delays: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.delays:
            raise ConfigurationError("delay levels must contain at least one delay, e.g. '1s 5s 10s'")
        for index, delay in enumerate(self.delays, start=1):
            validate_delay(delay, what=f"delay level {index}", error=ConfigurationError)

    @classmethod
    def parse(cls, spec: str | Sequence[str | float | timedelta]) -> DelayLevels:
        """Build a ladder from ``"1s 5s 1m"`` or a sequence of durations, seconds or timedeltas."""
        items: Sequence[str | float | timedelta] = spec.split() if isinstance(spec, str) else spec
        try:
            delays = tuple(parse_duration(i) if isinstance(i, str) else validate_delay(i) for i in items)
        except InvalidDelayError as exc:
            raise ConfigurationError(f"invalid delay ladder {spec!r}: {exc}") from None
        return cls(delays)

    def delay_for_level(self, level: int) -> float:
        """Seconds for 1-based ``level`` (``InvalidDelayError`` out of range)."""
        if not isinstance(level, int) or isinstance(level, bool) or not 1 <= level <= len(self.delays):
            raise InvalidDelayError(
                f"delay level must be an int from 1 to {len(self.delays)} "
                f"(ladder {self.describe()}); got {level!r}"
            )
        return self.delays[level - 1]

    def level_for_retry(self, reconsume_times: int) -> int:
        """Level used by level-increment mode for the ``reconsume_times``-th retry (1-based, capped)."""
        return min(max(1, reconsume_times), len(self.delays))

    def describe(self) -> str:
        return " ".join(_format_seconds(d) for d in self.delays)


def _format_seconds(seconds: float) -> str:
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


DEFAULT_LEVELS = DelayLevels.parse(DEFAULT_DELAY_LEVELS)
