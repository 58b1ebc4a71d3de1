"""The launcher's retry when a port picked as free is taken before the broker binds it (pure logic)."""

from __future__ import annotations

from typing import Any

import pytest

from pulsar_standalone import StandaloneError, broker


def test_a_bind_failure_is_retried_on_new_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []

    def start_once(data_dir: Any, **kwargs: Any) -> str:
        calls.append(data_dir)
        if len(calls) < broker.BIND_ATTEMPTS:
            raise StandaloneError("Apache Pulsar exited with code 1 ... Failed to bind Pulsar broker on ...")
        return "started"

    monkeypatch.setattr(broker, "_start_once", start_once)
    assert broker.start_standalone() == "started"
    assert len(calls) == broker.BIND_ATTEMPTS


def test_other_start_failures_and_the_last_bind_failure_are_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    errors = iter([StandaloneError("Java 21 is required")])
    monkeypatch.setattr(broker, "_start_once", lambda *a, **k: (_ for _ in ()).throw(next(errors)))
    with pytest.raises(StandaloneError, match="Java 21"):
        broker.start_standalone()

    calls: list[int] = []

    def always_taken(*args: Any, **kwargs: Any) -> None:
        calls.append(1)
        raise StandaloneError("java.net.BindException: Address already in use")

    monkeypatch.setattr(broker, "_start_once", always_taken)
    with pytest.raises(StandaloneError, match="Address already in use"):
        broker.start_standalone()
    assert len(calls) == broker.BIND_ATTEMPTS
