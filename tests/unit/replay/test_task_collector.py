"""A Python task runs with the cyclic collector seldom, and leaves the worker's settings as it found them."""

from __future__ import annotations

import gc

import pytest

from spark_apps.dlq_replay.arrow_util import TASK_GC_THRESHOLD, rare_collections


def test_a_task_freezes_what_is_alive_and_collects_seldom_then_restores_the_worker():
    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0
    with rare_collections():
        assert gc.get_threshold() == TASK_GC_THRESHOLD
        assert gc.get_freeze_count() > 0  # the worker's modules are out of the collector's scans
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_a_failing_task_restores_the_worker_too():
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), rare_collections():
        raise RuntimeError("task failed")
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_cyclic_garbage_made_in_a_task_is_still_collected():
    class Node:
        def __init__(self) -> None:
            self.me = self

    with rare_collections():
        for _ in range(3 * TASK_GC_THRESHOLD[0]):
            Node()
        assert gc.get_count()[0] < TASK_GC_THRESHOLD[0] + 1  # young collections still ran
    gc.collect()
