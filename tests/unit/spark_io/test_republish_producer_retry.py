"""Producer creation in the republish path: transient broker errors are retried, others are not."""

from __future__ import annotations

from typing import Any

import pulsar
import pytest

from spark_apps.dlq_replay.pulsar_io import republish
from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf


class FakeProducer:
    def last_sequence_id(self) -> int:
        return -1


class FakeClient:
    """``create_producer`` raises the given errors in turn, then returns a producer."""

    def __init__(self, errors: list[Exception]) -> None:
        self.errors = errors
        self.calls = 0

    def create_producer(self, topic: str, **kwargs: Any) -> object:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return FakeProducer()


@pytest.fixture
def publisher(monkeypatch: pytest.MonkeyPatch) -> Any:
    def make(errors: list[Exception]) -> Any:
        client = FakeClient(errors)
        monkeypatch.setattr(republish, "get_client", lambda conf: client)
        monkeypatch.setattr(republish.time, "sleep", lambda s: None)
        return republish._Publisher(PulsarConf(service_url="pulsar://127.0.0.1:6650"), None, 30_000), client

    return make


def test_a_restarting_broker_is_waited_for(publisher: Any) -> None:
    pub, client = publisher(
        [pulsar.ConnectError("ConnectError"), pulsar.BrokerPersistenceError("not enough bookies")]
    )
    state = pub._producer("dlq-replay-x-0", "persistent://t/ns/orders")
    assert state.error is None
    assert state.producer is not None
    assert client.calls == 3


def test_errors_that_waiting_cannot_fix_fail_at_once(publisher: Any) -> None:
    pub, client = publisher([pulsar.AuthorizationError("not authorized")])
    state = pub._producer("dlq-replay-x-0", "persistent://t/ns/orders")
    assert state.producer is None
    assert "AuthorizationError" in (state.error or "")
    assert client.calls == 1


def test_the_wait_is_bounded(publisher: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(republish, "CREATE_RETRY_S", 0.0)
    pub, client = publisher([pulsar.ConnectError("ConnectError")] * 5)
    state = pub._producer("dlq-replay-x-0", "persistent://t/ns/orders")
    assert state.producer is None
    assert "ConnectError" in (state.error or "")
    assert client.calls == 1
