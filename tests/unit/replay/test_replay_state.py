"""Run state: resume rules and run directory names."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pulsar_dlq_consumer.replay_options import ReplayOptionsError, check_run_id
from spark_apps.dlq_replay.errors import RunStateError
from spark_apps.dlq_replay.run_context import RunPaths, RunState, load_state, run_dir_name
from spark_apps.dlq_replay.storage import RunStorage


def _load(tmp_path, options: dict, saved: RunState | None = None, mode: str = "replay") -> RunState:
    """The state ``load_state`` continues with for run ``r1`` and its fingerprint ``options``."""
    paths, storage = RunPaths(str(tmp_path), "r1"), RunStorage()
    if saved is not None:
        storage.write_text(paths.state, saved.to_json())
    given = SimpleNamespace(run_id="r1", mode=mode, fingerprint_options=lambda digest: options)
    return load_state(storage, paths, given, SimpleNamespace(digest=""))  # type: ignore[arg-type]


def test_new_state_then_resume_counts_attempts_and_keeps_steps(tmp_path):
    state = _load(tmp_path, {"mode": "replay", "topics": ["a"]})
    state.mark_complete("plan", 1.23456, partitions=2)
    resumed = _load(tmp_path, {"mode": "replay", "topics": ["a"]}, saved=state)
    assert resumed.attempts == 2
    assert resumed.is_complete("plan")
    assert not resumed.is_complete("snapshot")
    assert resumed.info("plan")["partitions"] == 2
    assert resumed.timings == {"plan": 1.235}


def test_resume_with_other_options_is_refused_naming_the_change(tmp_path):
    state = _load(tmp_path, {"mode": "replay", "max_replays": 3})
    with pytest.raises(RunStateError, match=r"changed: max_replays.*new --run-id"):
        _load(tmp_path, {"mode": "replay", "max_replays": 4}, saved=state)


def test_unknown_step_and_bad_json(tmp_path):
    state = _load(tmp_path, {}, mode="dry-run")
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
