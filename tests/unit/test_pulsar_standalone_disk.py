"""The launcher's disk limits for the bookie: worked out per disk, and a full disk refused up front."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import pytest

from pulsar_standalone import StandaloneError, broker

GIB = 2**30
MIB = 2**20


class Usage(NamedTuple):
    total: int
    used: int
    free: int


def disk(monkeypatch: pytest.MonkeyPatch, total: int, free: int) -> None:
    monkeypatch.setattr(broker.shutil, "disk_usage", lambda _path: Usage(total, total - free, free))


def test_a_large_disk_stays_writable_until_256_mib_are_left(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The CI machine's case: 252 GiB with under 1% free, where the fixed 0.99 had turned the bookie read-only.
    disk(monkeypatch, 252 * GIB, 800 * MIB)
    limits = broker.disk_thresholds(tmp_path)
    full, warn = float(limits["diskUsageThreshold"]), float(limits["diskUsageWarnThreshold"])
    in_use = 1 - 800 * MIB / (252 * GIB)
    assert in_use > 0.99  # read-only under the old fixed threshold
    assert full > in_use  # writable now
    assert (1 - full) * 252 * GIB == pytest.approx(256 * MIB, rel=1e-3)
    assert (1 - warn) * 252 * GIB == pytest.approx(GIB, rel=1e-3)


def test_small_and_huge_disks_get_limits_bookkeeper_accepts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    disk(monkeypatch, 2 * GIB, GIB)
    assert broker.disk_thresholds(tmp_path) == {
        "diskUsageThreshold": "0.875000",
        "diskUsageWarnThreshold": "0.500000",
    }
    disk(monkeypatch, 512 * MIB, 300 * MIB)  # less than 1 GiB in all: warn from the start, still below full
    limits = broker.disk_thresholds(tmp_path)
    assert float(limits["diskUsageWarnThreshold"]) <= float(limits["diskUsageThreshold"]) == 0.5
    disk(monkeypatch, 2**50, 2**40)  # BookKeeper takes a fraction strictly below 1
    assert broker.disk_thresholds(tmp_path)["diskUsageThreshold"] == "0.999900"


def test_a_disk_without_room_is_refused_before_the_broker_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    disk(monkeypatch, 252 * GIB, 100 * MIB)
    monkeypatch.setattr(broker.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(broker, "resolve_classpath", lambda **_: SimpleNamespace(resolved_in_s=None))
    monkeypatch.setattr(broker, "find_java", lambda: (Path("java"), 21, "21"))

    def no_launch(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the broker was launched")

    monkeypatch.setattr(broker.StandaloneBroker, "_launch", no_launch)
    with pytest.raises(
        StandaloneError,
        match=r"only 100 MiB are free .* needs at least 256 MiB .* Free disk space.*data_dir=.*--data-dir",
    ):
        broker.start_standalone()
    assert list(tmp_path.iterdir()) == []  # the private data dir it made is gone again


def test_the_last_disk_full_line_of_the_log_is_reported() -> None:
    line = (
        "2026-11-26T07:53:{s},503 ERROR [LedgerDirsMonitorThread] o.a.b.u.DiskChecker - Space left on device "
        "/data/bookkeeper/current : {free}, Used space fraction: 0.9971079 > threshold 0.99."
    )
    log = "\n".join(
        [
            "2026-11-26T07:53:06,528 INFO  [BookieStateManagerService-0] o.a.p.m.c.i.ResourceLockImpl - ...",
            line.format(s="06", free=782598144),
            "\tat org.apache.bookkeeper.bookie.LedgerDirsManager.getDirsAboveUsableThresholdSize(...)",
            line.format(s="16", free=782454784),
            line.format(s="26", free=782454784).replace("> threshold 0.99", "> WarnThreshold 0.98"),
        ]
    )
    assert broker.bookie_disk_full(log) == line.format(s="16", free=782454784).split("] o.a.b.u.")[1]
    assert (
        broker.bookie_disk_full(line.format(s="06", free=1).replace("> threshold", "> WarnThreshold")) is None
    )
    assert broker.bookie_disk_full("2026-11-26T07:53:06,528 INFO  [main] started\n") is None
