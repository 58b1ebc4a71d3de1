"""Run state: resume rules and run directory names."""

from __future__ import annotations

import pytest

from pulsar_dlq_consumer.replay_options import ReplayOptionsError, check_run_id
from spark_apps.dlq_replay.errors import RunStateError
from spark_apps.dlq_replay.run_context import RunState, resume_or_start, run_dir_name


def test_new_state_then_resume_counts_attempts_and_keeps_steps():
    state = resume_or_start(None, "r1", "replay", {"mode": "replay", "topics": ["a"]})
    state.mark_complete("plan", 1.23456, partitions=2)
    again = RunState.from_json(state.to_json(), where="state.json")
    resumed = resume_or_start(again, "r1", "replay", {"mode": "replay", "topics": ["a"]})
    assert resumed.attempts == 2
    assert resumed.is_complete("plan")
    assert not resumed.is_complete("snapshot")
    assert resumed.info("plan")["partitions"] == 2
    assert resumed.timings == {"plan": 1.235}


def test_resume_with_other_options_is_refused_naming_the_change():
    state = resume_or_start(None, "r1", "replay", {"mode": "replay", "max_replays": 3})
    with pytest.raises(RunStateError, match=r"changed: max_replays.*new --run-id"):
        resume_or_start(state, "r1", "replay", {"mode": "replay", "max_replays": 4})


def test_unknown_step_and_bad_json():
    state = resume_or_start(None, "r1", "dry-run", {})
    with pytest.raises(ValueError, match="unknown step"):
        state.mark_complete("nope", 1.0)
    with pytest.raises(RunStateError, match="not a valid run state"):
        RunState.from_json("{", where="x/state.json")


@pytest.mark.parametrize(
    ("run_id", "safe"),
    [("nightly-2024.05.01", True), ("manual__2024-05-01T00:00:00+00:00", False), ("a b", False)],
)
def test_run_dir_names_are_path_safe_and_distinct(run_id, safe):
    name = run_dir_name(run_id)
    assert (name == run_id) is safe
    assert all(c.isalnum() or c in "._-" for c in name)
    assert run_dir_name(run_id + "x") != name


@pytest.mark.parametrize("bad", ["", " x", "a/b", "a\\b", "x\n", "x" * 251])
def test_invalid_run_ids(bad):
    with pytest.raises(ReplayOptionsError, match="invalid run id"):
        check_run_id(bad)
