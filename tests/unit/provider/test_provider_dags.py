"""The example DAGs import cleanly, cheaply, and have the promised shape and Param validation."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

DAGS = Path(__file__).resolve().parents[3] / "dags"


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


def test_dagbag_has_no_import_errors(dagbag):
    assert dagbag.import_errors == {}
    assert {"dlq_nightly_replay", "dlq_backfill", "dlq_event_driven_replay"} <= set(dagbag.dag_ids)


def test_parsing_does_no_heavy_work():
    code = (
        "import runpy, sys\n"
        "for name in ('dlq_nightly_replay.py', 'dlq_backfill.py', 'dlq_event_driven_replay.py'):\n"
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
    check, sensor, replay, report = (
        dag.get_task(t) for t in ("check_configuration", "wait_for_dlq_backlog", "replay", "report")
    )
    assert check.retries == 0
    assert sensor.upstream_task_ids == {"check_configuration"}
    assert sensor.soft_fail is True
    assert sensor.deferrable is True
    assert replay.upstream_task_ids == {"wait_for_dlq_backlog"}
    assert report.upstream_task_ids == {"replay"}
    assert [a.name for a in replay.outlets] == ["dlq_replay_reports"]
    assert "topics_from_backlog" in replay.topics
    assert [link.name for link in replay.operator_extra_links] == ["DLQ replay report", "Spark application"]


def render(dag, template, params=None, variables=None):
    """Render one templated field as Airflow would, with ``params`` and Variables (unset ones absent)."""
    variables = variables or {}
    var = SimpleNamespace(value=SimpleNamespace(get=lambda key, default="": variables.get(key, default)))
    return dag.get_template_env().from_string(template).render(params=params or {}, var=var)


def test_unpausing_the_nightly_dag_unconfigured_republishes_nothing(dagbag):
    from airflow.sdk.exceptions import AirflowSkipException

    dag = dagbag.dags["dlq_nightly_replay"]
    replay = dag.get_task("replay")
    assert render(dag, replay.mode) == "dry-run"  # no Variable: dry-run
    assert render(dag, replay.origin_allowlist) == ""  # no built-in allowlist
    assert render(dag, dag.get_task("wait_for_dlq_backlog").topics) == ""  # no built-in topics
    readiness = dagbag.dags["dlq_nightly_replay"].fileloc
    module = runpy.run_path(readiness)
    with pytest.raises(AirflowSkipException, match="dlq_topics is not set"):
        module["readiness"]("", "", "")
    plan = module["readiness"]("persistent://t/ns/a-DLQ", "", "")
    assert plan.startswith("dry-run on persistent://t/ns/a-DLQ")
    assert "dlq_nightly_mode=replay" in plan
    with pytest.raises(ValueError, match="dlq_origin_allowlist is empty"):
        module["readiness"]("persistent://t/ns/a-DLQ", "replay", "")
    with pytest.raises(ValueError, match="must be one of"):
        module["readiness"]("persistent://t/ns/a-DLQ", "republish-everything", "x")
    assert module["readiness"]("t", "replay", "persistent://t/ns/orders").startswith("replay on t")
    live = {"dlq_nightly_mode": "replay", "dlq_origin_allowlist": "persistent://t/ns/orders"}
    assert render(dag, replay.mode, variables=live) == "replay"
    assert render(dag, replay.origin_allowlist, variables=live) == "persistent://t/ns/orders"


def test_backfill_form_can_be_triggered_with_its_defaults(dagbag):
    """Every optional field is nullable with a None default (the UI then does not mark it required)
    and says what empty means; the defaults render to the Variables."""
    dag = dagbag.dags["dlq_backfill"]
    assert dag.schedule is None
    assert dag.max_active_runs == 1
    resolved = dag.params.validate()
    assert resolved["mode"] == "dry-run"
    for name in dag.params:
        if name == "mode":
            continue
        schema = dag.params.get_param(name).schema
        assert "null" in schema["type"], f"{name} would be required in the trigger form"
        assert resolved[name] is None, name
        description = dag.params.get_param(name).description or ""
        assert "Empty" in description, f"the form does not say what an empty {name} means"
    # The dry run takes the filters; the approved replay acts on the dry run's window and scope.
    dry_run, replay = dag.get_task("dry_run"), dag.get_task("replay")
    variables = {"dlq_topics": "persistent://t/ns/a-DLQ", "dlq_origin_allowlist": "persistent://t/ns/a"}
    params = dict(resolved)
    for task in (dry_run, replay):
        assert render(dag, task.topics, params, variables) == "persistent://t/ns/a-DLQ"
        assert render(dag, task.origin_allowlist, params, variables) == "persistent://t/ns/a"
        assert render(dag, task.playbook, params, variables) == ""
    assert render(dag, dry_run.signatures, params, variables) == ""
    assert render(dag, dry_run.max_messages, params, variables) == ""
    given = {**params, "topics": ["persistent://t/ns/b-DLQ", "c-DLQ"], "signatures": ["s1", "s2"]}
    assert render(dag, replay.topics, given, variables) == "persistent://t/ns/b-DLQ,c-DLQ"
    assert render(dag, dry_run.signatures, given, variables) == "s1,s2"


def test_replay_dags_share_one_pool_slot(dagbag):
    """No two replays at the same time: every task that runs the replay app takes the one slot of one
    Airflow pool, and every replay DAG runs once at a time."""
    from airflow_provider_dlq.operators.replay import DlqReplayOperator

    replays = [t for d in dagbag.dags.values() for t in d.tasks if isinstance(t, DlqReplayOperator)]
    dags = {t.dag_id for t in replays}
    assert {"dlq_nightly_replay", "dlq_backfill", "dlq_canary_replay", "dlq_event_driven_replay"} <= dags
    assert len(replays) >= 5  # the backfill's dry run and replay included
    assert {t.pool for t in replays} == {"dlq_replay"}
    assert {t.pool_slots for t in replays} == {1}
    assert {dagbag.dags[d].max_active_runs for d in dags} == {1}
    init = (DAGS.parent / "docker" / "airflow" / "init-stack.sh").read_text()
    assert 'airflow pools set "${DLQ_REPLAY_POOL:-dlq_replay}" 1 ' in init


def test_backfill_params_validate(dagbag):
    from airflow.sdk import ParamsDict
    from airflow.sdk.exceptions import ParamValidationError

    dag = dagbag.dags["dlq_backfill"]

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


def test_backfill_flow_is_dry_run_report_approval_replay_report(dagbag):
    dag = dagbag.dags["dlq_backfill"]
    upstream = {t.task_id: t.upstream_task_ids for t in dag.tasks}
    assert upstream == {
        "dry_run": set(),
        "report": {"dry_run"},
        "wants_replay": {"report"},
        "approve": {"wants_replay", "dry_run"},
        "replay": {"approve"},
        "replay_report": {"replay"},
    }
    assert dag.get_task("dry_run").mode == "dry-run"
    replay = dag.get_task("replay")
    assert "xcom_pull(task_ids='approve')" in replay.group_actions
    assert "xcom_pull(task_ids='dry_run')" in replay.window_from
    approve = dag.get_task("approve")
    assert approve.options == ["Apply the chosen actions", "Approve nothing"]
    assert approve.defaults == ["Approve nothing"]


def test_event_driven_dag_is_scheduled_on_the_pulsar_backlog_asset(dagbag):
    from airflow_provider_dlq.operators.backlog_watch import DlqBacklogRearmOperator

    dag = dagbag.dags["dlq_event_driven_replay"]
    assert dag.max_active_runs == 1
    assets = list(dag.timetable.asset_condition.objects)
    assert [a.name for a in assets] == ["pulsar_dlq_backlog"]
    (watcher,) = assets[0].watchers
    classpath, kwargs = watcher.trigger.serialize()
    assert classpath == "airflow_provider_dlq.triggers.backlog_event.DlqBacklogEventTrigger"
    assert kwargs["topics"] == ["persistent://public/default/orders-order-service-DLQ"]
    assert kwargs["min_backlog"] == 100
    rearm = dag.get_task("rearm_backlog_watch")
    assert isinstance(rearm, DlqBacklogRearmOperator)
    assert rearm.upstream_task_ids == {"replay"}
    assert [a.name for a in rearm.inlets] == ["pulsar_dlq_backlog"]


@pytest.mark.parametrize("dag_id", ["dlq_canary_replay", "dlq_event_driven_replay"])
def test_other_replay_dags_have_no_built_in_allowlist(dagbag, dag_id):
    """Unconfigured, the canary and event-driven DAGs republish nothing: no allowlist of their own, so
    the operator refuses replay mode before anything runs."""
    from airflow_provider_dlq.operators.replay_cli import ReplayArgumentError, build_replay_args

    dag = dagbag.dags[dag_id]
    replay = dag.get_task("replay")
    allowlist = render(dag, replay.origin_allowlist)
    assert allowlist == ""
    topics = render(dag, replay.topics) if isinstance(replay.topics, str) else replay.topics
    values = {"run_id": "r1", "service_url": "pulsar://b:6650", "output_dir": "/o", "mode": "replay"}
    with pytest.raises(ReplayArgumentError, match=r"--origin-allowlist is required|--topics is required"):
        build_replay_args({**values, "topics": topics, "origin_allowlist": allowlist})
    configured = {"dlq_origin_allowlist": "persistent://t/ns/orders"}
    assert render(dag, replay.origin_allowlist, variables=configured) == "persistent://t/ns/orders"
