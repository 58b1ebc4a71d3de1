"""The replay app runs everywhere with the same result: ``spark-submit`` of the bundle on three masters
(``local[2]``; a Spark standalone cluster of 2 workers x 1 core; a Spark Connect server, ``--remote``)
times two output roots (a local dir; ``s3://<bucket>/<prefix>`` on moto's S3 server), on the session
Apache Pulsar broker with the mixed DLQ of ``replay_e2e_support`` (every context format, every outcome).

Each of the six (master, root) pairs runs once: three as a plain run, three as a kill-and-resume case
(one per master, the other root), so every master meets both roots. Every case: exit 0, the report's
outcome totals are the DLQ's expected ones, each republished message reached its origin topic exactly
once (none lost, none doubled, nothing on a refused origin) and the pending messages are the ones the DLQ
says. The plain runs share one DLQ shape and must give the same report (totals and groups, not timings
or ids) on every master; a kill case SIGKILLs the spark-submit process group while apply sends a wave,
then runs the same run id again: 0 lost, 0 doubled.

The servers: ``spark_standalone.SparkCluster`` (one per module), the session's ``spark_connect`` and
``s3_server`` (conftest). The S3 keys and endpoint reach the driver, the cluster's executors and the
Connect server's tasks through their environment (the standard AWS variables), never argv.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from replay_e2e_support import (
    PLAYBOOK,
    MixedDlq,
    build_mixed_dlq,
    close_driver_clients,
    drain,
    expected_totals,
    pending_keys,
)

from spark_standalone import S3Server, SparkCluster

pytestmark = [pytest.mark.integration, pytest.mark.real_pulsar, pytest.mark.slow]

MASTERS = ("local", "cluster", "connect")
ROOTS = ("local-dir", "s3")
#: Outcomes of the mixed DLQ: the report's totals of these must be the DLQ's expected ones.
OUTCOMES = (
    "republished",
    "archived",
    "dropped",
    "loop_guarded",
    "skipped",
    "fix_failed",
    "malformed",
    "origin_refused",
)
PENDING = ("skipped", "fix_failed", "malformed", "origin_refused")
PER_KIND = 2  # 28 DLQ messages a case (6 republished)
KILL_PER_KIND = 4  # 56 DLQ messages (12 republished): 3 waves of 2 messages x 2 producers, sent slowly
KILL_PACE = ("--rate-limit", "4", "--wave-size", "2")
BUCKET = "dlq-everywhere"


@pytest.fixture(autouse=True, scope="module")
def _close_clients_after_module() -> Iterator[None]:
    yield
    close_driver_clients()


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from airflow_provider_dlq.bundle import build_bundle

    return build_bundle(tmp_path_factory.mktemp("everywhere-bundle"))


@pytest.fixture(scope="module")
def cluster(s3_server: S3Server) -> Iterator[SparkCluster]:
    """Master + 2 workers x 1 core, whose executors have the S3 server's environment."""
    cluster = SparkCluster(env=s3_server.env)
    cluster.start(workers=2, cores=1, memory="1g")
    try:
        yield cluster
    finally:
        cluster.stop()


#: Normalised reports of the cases run so far (case -> report), to compare every case with the first.
REPORTS: dict[str, dict[str, Any]] = {}


# --------------------------------------------------------------------------- where a run goes


def submit_conf(master: str, request: pytest.FixtureRequest) -> list[str]:
    """spark-submit options choosing ``master`` (the cluster and the Connect server start on first use)."""
    if master == "local":
        return [
            "--master", "local[2]", "--driver-memory", "1g",
            "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=4",
        ]  # fmt: skip
    if master == "cluster":
        cluster: SparkCluster = request.getfixturevalue("cluster")
        return [
            "--master", cluster.master_url, "--deploy-mode", "client", "--driver-memory", "1g",
            "--executor-memory", "768m", "--executor-cores", "1", "--total-executor-cores", "2",
            "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=4",
        ]  # fmt: skip
    url: str = request.getfixturevalue("spark_connect")
    # spark.api.mode=connect: spark-submit's PythonRunner hands the driver SPARK_REMOTE only then (in the
    # classic mode it starts a Py4J gateway and the driver's SparkSession.builder asks for a master).
    return ["--remote", url, "--conf", "spark.api.mode=connect"]


@dataclass
class Root:
    """An output root: a local dir or ``s3://BUCKET/<prefix>`` on the session's S3 server."""

    uri: str
    s3: S3Server | None = None

    def read(self, *parts: str) -> bytes | None:
        """The bytes of ``<root>/<parts>``, or ``None`` when there is no such file."""
        if self.s3 is None:
            path = Path(self.uri, *parts)
            return path.read_bytes() if path.is_file() else None
        bucket, _, prefix = self.uri.removeprefix("s3://").partition("/")
        client = self.s3.client()
        try:
            return bytes(client.get_object(Bucket=bucket, Key="/".join([prefix, *parts]))["Body"].read())
        except client.exceptions.NoSuchKey:
            return None

    def json(self, *parts: str) -> dict[str, Any]:
        data = self.read(*parts)
        if data is None:
            return {}
        try:
            return dict(json.loads(data))
        except ValueError:  # a local file being replaced
            return {}

    def listing(self) -> list[str]:
        if self.s3 is None:
            base = Path(self.uri)
            return sorted(str(p.relative_to(base)) for p in base.rglob("*") if p.is_file())
        bucket, _, prefix = self.uri.removeprefix("s3://").partition("/")
        return [k[len(prefix) + 1 :] for k in self.s3.keys(bucket, prefix + "/")]


def output_root(kind: str, case: str, s3_server: S3Server, tmp_path: Path) -> Root:
    if kind == "local-dir":
        return Root(str(tmp_path / "out"))
    s3_server.bucket(BUCKET)
    return Root(f"s3://{BUCKET}/{case}-{uuid.uuid4().hex[:8]}", s3_server)


def app_args(broker: Any, mixed: MixedDlq, root: Root, run_id: str, *extra: str) -> list[str]:
    return [
        "--run-id", run_id, "--mode", "replay", "--service-url", broker.service_url,
        "--admin-url", broker.admin_url, "--topics", mixed.topics_arg, "--output-dir", root.uri,
        "--playbook", PLAYBOOK, "--origin-allowlist", "orders-*", "--idle-timeout-ms", "1500", *extra,
    ]  # fmt: skip


def start(
    bundle: Any, conf: list[str], args: list[str], workdir: Path, name: str, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    """spark-submit of the bundle (``--py-files``, as in production) in a process group of its own; the
    driver's JVM and Python temp dirs are in ``workdir`` (a killed run leaves nothing in the system temp
    dir)."""
    jvm_tmp = workdir / f"{name}-jvm-tmp"
    jvm_tmp.mkdir(parents=True, exist_ok=True)
    py_tmp = workdir / f"{name}-tmp"
    py_tmp.mkdir(parents=True, exist_ok=True)
    cmd = [
        str(Path(sys.executable).parent / "spark-submit"), *conf,
        "--conf", f"spark.driver.extraJavaOptions=-Djava.io.tmpdir={jvm_tmp}",
        "--py-files", str(bundle.zip_path), str(bundle.main_path), *args,
    ]  # fmt: skip
    (workdir / f"{name}.argv").write_text(json.dumps(cmd))
    out = open(workdir / f"{name}.out", "wb")  # noqa: SIM115 - closed with the process
    err = open(workdir / f"{name}.err", "wb")  # noqa: SIM115
    return subprocess.Popen(
        cmd,
        cwd=workdir,
        stdout=out,
        stderr=err,
        env={**os.environ, **env, "TMPDIR": str(py_tmp)},
        start_new_session=True,
    )


_ERROR_LINE = re.compile(r" ERROR | failed|[A-Za-z](Error|Exception)\b:|^\S*(Error|Exception)\b")
#: A log line's level: Spark's log4j lines (``26/11/28 14:53:40 WARN ...``) and the app's own.
_LEVEL = re.compile(r"^(?:\d\d/\d\d/\d\d|\d{4}-\d\d-\d\d) \d\d:\d\d:\d\d(?:[,.]\d+)? ([A-Z]+) ")


def first_error(err: str) -> str:
    """The first line of the driver's stderr that reports an error: not in a warning's block (a WARN
    line and the stack trace under it), not a stack frame (for the failure message)."""
    level = ""
    for line in err.splitlines():
        match = _LEVEL.match(line)
        if match:
            level = match.group(1)
        elif line.startswith("Traceback "):
            level = "ERROR"
        if level in ("WARN", "WARNING", "INFO", "DEBUG") or line.startswith("\tat "):
            continue
        if _ERROR_LINE.search(line):
            return line.strip()[:600]
    return "(no error line)"


def check_ran_on(master: str, request: pytest.FixtureRequest, spark: dict[str, Any]) -> None:
    """The run's Spark (its report's ``spark``) is the one ``master`` names: under Connect, the server's own
    application (the driver ran no Spark of its own)."""
    if master == "connect":
        server = request.getfixturevalue("spark_connect_server")
        assert spark["application_id"] == server.application_id, spark
    elif master == "cluster":
        assert spark["master"] == request.getfixturevalue("cluster").master_url, spark
        assert spark["application_id"].startswith("app-"), spark
    else:
        assert spark["master"] == "local[2]", spark
        assert spark["application_id"].startswith("local-"), spark


def server_logs(master: str, request: pytest.FixtureRequest) -> str:
    """The end of the Connect server's or the cluster's logs (for a failing case's message)."""
    if master == "connect":
        return "--- Connect server log (end):\n" + request.getfixturevalue("spark_connect_server").tail(30)
    if master == "cluster":
        logs = request.getfixturevalue("cluster").logs()
        return "".join(f"--- {name} log (end):\n{text}\n" for name, text in logs.items())
    return ""


def finish(
    proc: subprocess.Popen[bytes],
    workdir: Path,
    name: str,
    logs: Callable[[], str] = str,
    timeout: float = 600,
) -> dict[str, Any]:
    """Wait for a run that must succeed; returns its summary line. ``logs()``: the servers' logs, for the
    failure message."""
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise
    out = (workdir / f"{name}.out").read_text(errors="replace")
    err = (workdir / f"{name}.err").read_text(errors="replace")
    assert code == 0, (
        f"{name} exited {code}; first error: {first_error(err)}\n--- stderr (end):\n{err[-5000:]}\n"
        f"--- stdout (end):\n{out[-1500:]}\n{logs() if code else ''}"
    )
    last = out.strip().splitlines()[-1]
    assert last.startswith("DLQ_REPLAY_SUMMARY "), out[-2000:]
    return dict(json.loads(last[len("DLQ_REPLAY_SUMMARY ") :]))


def _group(proc: subprocess.Popen[bytes]) -> list[psutil.Process]:
    try:
        root = psutil.Process(proc.pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def signal_group(proc: subprocess.Popen[bytes], procs: list[psutil.Process], sig: int) -> None:
    """``sig`` to spark-submit's process group (its own session) and to any child that left it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(sig)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    procs = _group(proc)
    signal_group(proc, procs, signal.SIGKILL)
    proc.wait(timeout=60)
    psutil.wait_procs(procs, timeout=60)


def kill_in_apply(proc: subprocess.Popen[bytes], root: Root, run_id: str, workdir: Path, name: str) -> str:
    """SIGKILL the spark-submit process group while apply sends a wave (one wave saved, the next in
    flight): the group is frozen (SIGSTOP) first, the state read again, then killed. Returns apply's
    status at the kill (``running`` when the kill landed where it was meant to)."""

    def apply_progress() -> dict[str, Any]:
        return dict(root.json("runs", run_id, "state.json").get("steps", {}).get("apply", {}))

    def in_flight(progress: dict[str, Any]) -> bool:
        return (
            progress.get("status") == "running"
            and progress.get("waves_done", 0) >= 1
            and "wave_in_flight" in progress
        )

    deadline = time.monotonic() + 600
    while not in_flight(apply_progress()):
        if proc.poll() is not None:
            err = (workdir / f"{name}.err").read_text(errors="replace")
            raise AssertionError(
                f"the run exited (code {proc.returncode}) before apply sent a second wave; first error: "
                f"{first_error(err)}\n--- stderr (end):\n{err[-4000:]}"
            )
        assert time.monotonic() < deadline, "timed out waiting for apply's second wave"
        time.sleep(0.02)
    procs = _group(proc)
    signal_group(proc, procs, signal.SIGSTOP)
    status = str(apply_progress().get("status", "missing"))
    signal_group(proc, procs, signal.SIGKILL)
    proc.wait(timeout=60)
    psutil.wait_procs(procs, timeout=60)
    return status


# --------------------------------------------------------------------------- what every case checks


def outcome_totals(report: dict[str, Any]) -> dict[str, int]:
    return {k: int(report["totals"][k]) for k in OUTCOMES if report["totals"].get(k)}


def check_broker_end_state(client: Any, mixed: MixedDlq) -> None:
    """Each republished message on its origin exactly once, nothing on the refused origin, and exactly
    the pending outcomes still pending on the DLQs."""
    copies = Counter(m.partition_key() for m in drain(client, mixed.orders, f"verify-{uuid.uuid4().hex[:8]}"))
    want = mixed.keys("republished")
    lost = sorted(want - set(copies))
    doubled = {k: n for k, n in copies.items() if n > 1}
    unexpected = sorted(set(copies) - want)
    assert (lost, doubled, unexpected) == ([], {}, []), (
        f"lost {lost}, doubled {doubled}, unexpected {unexpected}"
    )
    assert drain(client, mixed.admin, f"verify-{uuid.uuid4().hex[:8]}", idle_ms=800) == []
    assert pending_keys(client, mixed) == sorted(mixed.keys(*PENDING))


def normalised(report: dict[str, Any], mixed: MixedDlq) -> dict[str, Any]:
    """What must not differ between masters and roots: the totals and, per group, its signature and what
    was decided and done; without timings, paths, message ids and the topics' random part."""
    suffix = mixed.orders.rsplit("-", 1)[1]

    def scrub(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace(suffix, "<u>")
        if isinstance(value, list):
            return [scrub(v) for v in value]
        if isinstance(value, dict):
            return {k: scrub(v) for k, v in value.items() if k not in VOLATILE}
        return value

    groups = sorted((scrub(g) for g in report.get("groups", [])), key=lambda g: json.dumps(g, sort_keys=True))
    return {"totals": scrub(report["totals"]), "groups": groups, "mode": report.get("mode")}


#: Report fields that differ from run to run by nature (ids, clocks, places; a signature hashes its
#: origin topic, whose name is random here).
VOLATILE = frozenset(
    {
        "signature",
        "sample_message_ids",
        "message_id",
        "samples",
        "first_seen",
        "last_seen",
        "first_publish_time",
        "last_publish_time",
        "timings",
        "paths",
        "started_at",
        "finished_at",
        "run_id",
    }
)


def compare_with_other_cases(case: str, report: dict[str, Any]) -> None:
    if REPORTS:
        first, reference = next(iter(REPORTS.items()))
        assert report == reference, f"{case}'s report differs from {first}'s"
    REPORTS[case] = report


# --------------------------------------------------------------------------- the matrix


#: The output root of each master's kill-and-resume case (S3 for the Connect server's at least).
KILL_CASES = (("local", "local-dir"), ("cluster", "s3"), ("connect", "s3"))
#: The plain runs: each master with the root its kill case does not use.
RUN_CASES = tuple((m, r) for m in MASTERS for r in ROOTS if (m, r) not in KILL_CASES)


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("master", "root_kind"), RUN_CASES, ids=[f"{m}-{r}" for m, r in RUN_CASES])
def test_replay_everywhere(
    master, root_kind, request, bundle, s3_server, pulsar_broker, pulsar_client, tmp_path
):
    case = f"{master}-{root_kind}"
    mixed = build_mixed_dlq(pulsar_client, per_kind=PER_KIND)
    root = output_root(root_kind, case, s3_server, tmp_path)
    run_id = f"everywhere-{case}"
    conf = submit_conf(master, request)
    proc = start(bundle, conf, app_args(pulsar_broker, mixed, root, run_id), tmp_path, "run", s3_server.env)
    summary = finish(proc, tmp_path, "run", lambda: server_logs(master, request))
    assert summary["status"] == "succeeded", summary
    check_ran_on(master, request, summary["spark"])
    assert outcome_totals(summary) == expected_totals(mixed)
    assert summary["totals"]["snapshot"] == len(mixed.expected)
    report = root.json("runs", run_id, "report.json")
    assert report, f"no report.json under {root.uri}/runs/{run_id}: {root.listing()[:40]}"
    assert report["totals"] == summary["totals"]
    assert outcome_totals(report) == expected_totals(mixed)
    check_broker_end_state(pulsar_client, mixed)
    compare_with_other_cases(case, normalised(report, mixed))


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("master", "root_kind"), KILL_CASES, ids=[f"{m}-{r}" for m, r in KILL_CASES])
def test_kill_during_apply_then_resume_everywhere(
    master, root_kind, request, bundle, s3_server, pulsar_broker, pulsar_client, tmp_path
):
    case = f"kill-{master}-{root_kind}"
    mixed = build_mixed_dlq(pulsar_client, per_kind=KILL_PER_KIND)
    root = output_root(root_kind, case, s3_server, tmp_path)
    run_id = f"everywhere-{case}"
    conf = submit_conf(master, request)
    args = app_args(pulsar_broker, mixed, root, run_id, *KILL_PACE)
    first = start(bundle, conf, args, tmp_path, "first", s3_server.env)
    status = kill_in_apply(first, root, run_id, tmp_path, "first")
    assert status == "running", f"the kill landed after apply ended ({status}); nothing was tested"
    resume = start(bundle, conf, args, tmp_path, "resume", s3_server.env)
    summary = finish(resume, tmp_path, "resume", lambda: server_logs(master, request))
    assert summary["status"] == "succeeded", summary
    check_ran_on(master, request, summary["spark"])
    assert outcome_totals(summary) == expected_totals(mixed)
    assert summary["totals"]["resent"] > 0  # the wave in flight was sent again (and dropped by dedup)
    check_broker_end_state(pulsar_client, mixed)  # 0 lost, 0 doubled, the right ones pending
