"""Fixes used by the fault suite's playbook: one that works and eight that misbehave."""

from __future__ import annotations

import json
import os
import sys
import time

from spark_apps.dlq_replay.fixes import batch_fix


def add_currency(record):
    order = json.loads(record.payload)  # an empty or non-JSON payload: malformed
    order.setdefault("currency", "EUR")
    return json.dumps(order).encode()


def raises(record):
    raise RuntimeError("this fix always fails")


def hangs(record):
    time.sleep(300)
    return record.payload


def wrong_type(record):
    return 42


def huge(record):
    return b"x" * (6 * 1024 * 1024)


def too_big_for_broker(record):
    """A payload under the fix limit whose properties take the message past the broker's 5 MiB."""
    return b"x" * (5 * 1024 * 1024 - 20 * 1024), {"fault-bulk": "y" * 40_000}


def exits(record):
    sys.exit(3)


@batch_fix
def interrupts(records):
    raise KeyboardInterrupt


def os_exits(record):
    os._exit(3)
