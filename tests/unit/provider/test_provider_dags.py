"""The example DAGs import cleanly, cheaply, and have the promised shape and Param validation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

DAGS = Path(__file__).resolve().parents[3] / "dags"


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


def test_dagbag_has_no_import_errors(dagbag):
    assert dagbag.import_errors == {}
    assert {"dlq_nightly_replay", "dlq_backfill"} <= set(dagbag.dag_ids)


def test_parsing_does_no_heavy_work():
    code = (
        "import runpy, sys\n"
        "for name in ('dlq_nightly_replay.py', 'dlq_backfill.py'):\n"
        f"    runpy.run_path({str(DAGS)!r} + '/' + name)\n"
        "heavy = [m for m in ('pyspark', 'pulsar', 'spark_apps') if m in sys.modules]\n"
        "print(','.join(heavy)); sys.exit(1 if heavy else 0)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, f"parse-time imports: {proc.stdout} {proc.stderr[-2000:]}"


def test_nightly_shape(dagbag):
    dag = dagbag.dags["dlq_nightly_replay"]
    assert dag.catchup is False
    assert dag.max_active_runs == 1
    assert dag.timetable.expression == "0 2 * * *"
    sensor, replay, report = (dag.get_task(t) for t in ("wait_for_dlq_backlog", "replay", "report"))
    assert sensor.soft_fail is True
    assert sensor.deferrable is True
    assert replay.upstream_task_ids == {"wait_for_dlq_backlog"}
    assert report.upstream_task_ids == {"replay"}
    assert [a.name for a in replay.outlets] == ["dlq_replay_reports"]
    assert "topics_from_backlog" in replay.topics


def test_nightly_and_backfill_replays_share_one_pool_slot(dagbag):
    """The two DAGs cannot replay at the same time: one Airflow pool, one slot each, one run per DAG."""
    replays = [dagbag.dags[d].get_task("replay") for d in ("dlq_nightly_replay", "dlq_backfill")]
    assert {t.pool for t in replays} == {"dlq_replay"}
    assert [t.pool_slots for t in replays] == [1, 1]
    assert [dagbag.dags[d].max_active_runs for d in ("dlq_nightly_replay", "dlq_backfill")] == [1, 1]
    init = (DAGS.parent / "docker" / "airflow" / "init-stack.sh").read_text()
    assert 'airflow pools set "${DLQ_REPLAY_POOL:-dlq_replay}" 1 ' in init


def test_backfill_params_default_to_dry_run_and_validate(dagbag):
    from airflow.sdk import ParamsDict
    from airflow.sdk.exceptions import ParamValidationError

    dag = dagbag.dags["dlq_backfill"]
    assert dag.schedule is None
    assert dag.max_active_runs == 1
    assert dag.params["mode"] == "dry-run"
    resolved = dag.params.validate()
    assert resolved["topics"] == []
    assert resolved["max_messages"] is None

    def check(**conf):
        params = ParamsDict(dag.params)
        for key, value in conf.items():
            params[key] = value
        return params.validate()

    good = check(
        topics=["persistent://public/default/orders-DLQ"], mode="replay", since="2024-05-01T00:00:00Z"
    )
    assert good["mode"] == "replay"
    for bad in (
        {"mode": "delete-everything"},
        {"max_messages": 0},
        {"since": "last tuesday"},
        {"topics": ["not a/topic name/at all/x"]},
    ):
        with pytest.raises(ParamValidationError):
            check(**bad)
