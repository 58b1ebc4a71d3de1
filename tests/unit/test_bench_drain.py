"""The benchmark's copy loops subscribe again when a consumer stops dispatching (pure logic, fake
consumers: the real broker behaviour is in docs/benchmarks.md and the smoke test runs the real loops)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.pulsar_io import Stalled, drain_resubscribing


class FakeConsumer:
    """Hands out its batches, then nothing (a stalled dispatch); records what was acked and closed."""

    def __init__(self, batches: list[list[int]]) -> None:
        self.batches = list(batches)
        self.acked: list[int] = []
        self.closed = False

    def batch_receive(self) -> list[int]:
        return self.batches.pop(0) if self.batches else []

    def acknowledge(self, msg: int) -> None:
        self.acked.append(msg)

    def close(self) -> None:
        self.closed = True


def _copy(consumers: list[FakeConsumer], expected: int, idle_timeout_s: float) -> tuple[int, int, list[int]]:
    handed = iter(consumers)
    copied: list[int] = []

    def handle(consumer: Any, batch: list[Any]) -> None:
        copied.extend(batch)
        for msg in batch:
            consumer.acknowledge(msg)

    received, again = drain_resubscribing(
        lambda: next(handed), handle, expected=expected, idle_timeout_s=idle_timeout_s, stall_s=0.05
    )
    return received, again, copied


def test_a_stalled_consumer_is_replaced_and_each_message_acked_by_its_receiver():
    first = FakeConsumer([[1, 2], [3]])  # stalls after 3 of 6
    second = FakeConsumer([[4, 5], [6]])
    received, again, copied = _copy([first, second], expected=6, idle_timeout_s=5.0)
    assert (received, again, copied) == (6, 1, [1, 2, 3, 4, 5, 6])
    assert first.acked == [1, 2, 3]
    assert second.acked == [4, 5, 6]
    assert first.closed
    assert second.closed


def test_no_message_over_every_consumer_for_the_idle_timeout_fails_with_the_count():
    consumers = [FakeConsumer([[1]])] + [FakeConsumer([]) for _ in range(100)]
    with pytest.raises(Stalled, match=r"received 1 of 4 messages.*consumer\(s\)") as stall:
        _copy(consumers, expected=4, idle_timeout_s=0.3)
    assert stall.value.received == 1
    assert consumers[0].acked == [1]
    used = [c for c in consumers if c.closed]
    assert len(used) >= 2, "it subscribed again before giving up"
    assert all(c.closed for c in consumers[: len(used)]), "every consumer it took was closed"
