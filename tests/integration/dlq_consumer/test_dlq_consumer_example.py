"""The documented example runs as written against the embedded broker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "examples" / "orders_consumer.py"


def test_orders_consumer_example_runs_as_written():
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=180, check=False
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "received=8 acked=3 termed=2 retried=2 nacked=1 failed=0" in out
    assert out.count("DLQ: reason=term") == 2
    assert "error=InvalidOrder: order o-2: total must be positive, got -3" in out
    assert "dead-lettered=2" in out
    assert "not json" not in out + proc.stderr  # payloads are never printed or logged
