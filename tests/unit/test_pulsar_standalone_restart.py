"""The launcher's restart when the bookie registration loops after a crash (pure logic, stand-in JVM)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pulsar_standalone import StandaloneError, broker

# Lines as Apache Pulsar 4.0.7 standalone logs them right after a SIGKILLed broker is started again.
LOOPING = (
    "2026-11-24T20:45:29,601 INFO  [BookieStateManagerService-0] o.a.p.m.c.i.ResourceLockImpl - Successfully "
    "re-acquired missing lock at /ledgers/available/127.0.0.1:46297\n"
    "2026-11-24T20:45:29,605 INFO  [metadata-store-1-1] o.a.p.m.c.i.ResourceLockImpl - Lock on resource "
    "/ledgers/available/127.0.0.1:46297 was invalidated\n"
)
HEALTHY = (
    "2026-11-24T20:46:11,610 INFO  [BookieStateManagerService-0] o.a.p.m.c.i.ResourceLockImpl - Acquired "
    "resource lock on /ledgers/available/127.0.0.1:46297\n"
    "2026-11-24T20:46:16,184 INFO  [main] o.a.p.m.c.i.ResourceLockImpl - Lock on resource "
    "/namespace/public/default/0x00000000_0x40000000 was invalidated\n"
)


def test_only_an_invalidated_bookie_registration_counts_as_the_loop() -> None:
    assert broker.bookie_registration_loops(LOOPING)
    assert not broker.bookie_registration_loops(HEALTHY)
    assert not broker.bookie_registration_loops("")


class StandIn:
    """Plays the broker JVM: each launch appends the next scripted log to ``broker.log``."""

    def __init__(self, tmp_path: Path, logs: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
        self.broker = broker.StandaloneBroker(
            service_url="pulsar://127.0.0.1:1", admin_url="http://127.0.0.1:2", data_dir=tmp_path, conf={},
            java=Path("java"), java_major=21, bookie_port=3, started_in_s=0.0, classpath_resolved_in_s=None,
            owns_data_dir=True,
        )  # fmt: skip
        self.logs = iter(logs)
        self.stops: list[Any] = []
        self.broker.log_path.write_text("the first run's log, killed mid-write " + LOOPING)
        monkeypatch.setattr(self.broker, "_launch", self.launch)
        monkeypatch.setattr(self.broker, "_wait_ready", lambda timeout_s: None)
        monkeypatch.setattr(self.broker, "stop", lambda **kwargs: self.stops.append(kwargs))

    def launch(self, *, wipe: bool) -> None:
        assert not wipe
        with self.broker.log_path.open("a") as log_file:
            log_file.write(next(self.logs))


def test_a_restart_whose_registration_loops_is_stopped_cleanly_and_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The killed run's own log lines (before this restart) do not count; only what this start logged.
    stand_in = StandIn(tmp_path, [LOOPING, HEALTHY], monkeypatch)
    stand_in.broker.restart()
    assert stand_in.stops == [{"remove_data": False}]
    assert "bookie registration in a loop (attempt 1)" in caplog.text
    assert stand_in.broker.started_in_s > 0


def test_a_registration_that_loops_on_every_attempt_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in = StandIn(tmp_path, [LOOPING] * broker.RESTART_ATTEMPTS, monkeypatch)
    with pytest.raises(StandaloneError, match="start a new broker on a fresh data dir"):
        stand_in.broker.restart()
    assert stand_in.stops == [{"remove_data": False}] * broker.RESTART_ATTEMPTS


def test_a_healthy_restart_is_not_repeated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in = StandIn(tmp_path, [HEALTHY], monkeypatch)
    stand_in.broker.restart()
    assert stand_in.stops == []
