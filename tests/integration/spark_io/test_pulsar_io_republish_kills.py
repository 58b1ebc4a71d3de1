"""Republish killed mid-send, again and again, then resumed: on Apache Pulsar with broker deduplication
every row reaches the origin exactly once, whatever batch the kill fell in; a row the broker refuses is
reported for that row only.

Each attempt is a process of its own (``republish_child.py``) sending the same rows as one send task of
a wave does; the test SIGKILLs it at points spread over the send, then lets the last attempt finish, and
counts the origin with a consumer that reads everything (nothing acked).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pulsar_io_helpers import drain, wait_for_deduplication
from republish_child import replay_id

pytestmark = pytest.mark.integration

CHILD = Path(__file__).with_name("republish_child.py")
REPO = Path(__file__).resolve().parents[3]


def attempt(spec: dict[str, Any], kill_after_s: float | None) -> None:
    """One attempt: SIGKILLed ``kill_after_s`` after it starts sending, or left to finish."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"sending", proc.stderr.read() if proc.stderr else ""
        if kill_after_s is None:
            _, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err.decode()[-3000:]
            return
        time.sleep(kill_after_s)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_sends_killed_at_many_points_then_resumed_are_exact_under_deduplication(
    pulsar_broker, pulsar_client, topic_factory, tmp_path
):
    target = topic_factory("rp-kills")
    drain(pulsar_client, target, "check", timeout_ms=10)  # creates the subscription that keeps them
    wait_for_deduplication(pulsar_broker.admin_url, target)
    too_big = [[0, 0], [1, 777], [0, 4321], [1, 9999]]  # a producer's first, middle and last rows
    spec = {
        "service_url": pulsar_broker.service_url,
        "target": target,
        "name": f"dlq-replay-kills-{uuid.uuid4().hex[:6]}",
        "producers": 2,
        "per_producer": 10_000,
        "batch_rows": 3_000,  # input batches end mid-block: they must not cut the client's batches
        "rate": 8_000.0,  # about 2.5 s a full attempt, so the kills land inside the send
        "too_big": too_big,
        "results": str(tmp_path / "results.jsonl"),
    }
    rng = random.Random(20261128)
    kills = [round(rng.uniform(0.05, 2.4), 3) for _ in range(10)]
    for after in kills:
        attempt(spec, after)
    attempt(spec, None)

    results = [json.loads(line) for line in Path(spec["results"]).read_text().splitlines()]
    refused = {replay_id(p, s) for p, s in too_big}
    expected = {replay_id(p, s) for p in range(2) for s in range(10_000)}
    assert {r["replay_id"] for r in results} == expected
    assert len(results) == len(expected)
    failed = {r["replay_id"]: r["error"] for r in results if not r["published"]}
    assert set(failed) == refused, sorted(failed.items())[:5]
    assert all(e == "send refused: Result.MessageTooBig" for e in failed.values()), failed

    copies = Counter(m.properties()["REPLAY_ID"] for m in drain(pulsar_client, target, "check"))
    lost = expected - refused - set(copies)
    doubled = sum(n - 1 for n in copies.values())
    assert (len(lost), doubled) == (0, 0), (sorted(lost)[:5], kills)
    assert not refused & set(copies)
