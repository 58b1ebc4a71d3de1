"""Both wheels, built fresh from this checkout, each installed with plain pip into a fresh venv.

* The library wheel alone (no Airflow, no pyspark): its own tests pass there, against this session's
  Apache Pulsar broker.
* The provider wheel with the extra ``pyspark`` (and the library wheel, which is not on PyPI yet): the
  newest Spark provider (6.x, with its ``pyspark-client``), ``pip check`` clean, pyspark's files as its
  RECORD says except the Python files ``pyspark-client`` also ships (pip writes it last), spark-submit
  running pyspark's own files (``test_pyspark_files.py`` in that venv), nothing generic at top level, and a
  dry-run of the installed example DAG ``dlq_backfill`` (Airflow CLI, local Spark) on a real DLQ.

Venv sizes and install times go to the terminal summary ("wheel installs"). Dependencies come from PyPI
(pip's own cache makes later runs faster).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pulsar
import pytest

from pulsar_dlq_consumer import DeadLetterPolicy, DlqConsumer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
#: The library's tests that run with the library alone. The others in these folders need the provider
#: (PulsarHook, the embedded broker) and run in the main suite.
LIBRARY_TESTS = ("tests/unit/dlq_consumer", "tests/integration/dlq_consumer")
NEEDS_PROVIDER = (
    "tests/integration/dlq_consumer/test_official_dlq_policy_replay.py",
    "tests/integration/dlq_consumer/test_dlq_consumer_example.py",
    "tests/integration/dlq_consumer/test_dlq_consumer_embedded.py",
)
TEST_TOOLS = ("pytest>=8", "pytest-timeout>=2.3")
SUB = "dlq-replayer"


def _uv() -> str:
    found = shutil.which("uv") or str(Path.home() / ".local" / "bin" / "uv")
    if not Path(found).is_file():
        pytest.fail("uv is needed to build the wheels: pip install uv (scripts/env.sh installs it)")
    return found


def _run(cmd: list[str], *, timeout: float, **kwargs: object) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, **kwargs)  # type: ignore[call-overload]
    assert result.returncode == 0, (
        f"{cmd} failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    )
    return result


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment minus this project's venv, so nothing leaks into the fresh one."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    env.update(extra)
    return env


def _venv_size_mib(venv: Path) -> float:
    return sum(p.stat().st_size for p in venv.rglob("*") if p.is_file() and not p.is_symlink()) / 2**20


def _fresh_venv_with(venv: Path, requirements: list[str], label: str, record_figure) -> Path:
    """``python -m venv`` + ``pip install`` (plain pip, PyPI); returns the venv's python."""
    base_python = getattr(sys, "_base_executable", sys.executable)
    _run([base_python, "-m", "venv", str(venv)], timeout=120, env=_clean_env())
    python = venv / "bin" / "python"
    started = time.monotonic()
    _run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--progress-bar",
            "off",
            *requirements,
        ],
        timeout=3000,
        env=_clean_env(),
    )
    took = time.monotonic() - started
    record_figure(f"{label}: pip install {took:.0f} s, venv {_venv_size_mib(venv):.0f} MiB")
    return python


def _installed(python: Path) -> dict[str, str]:
    out = _run(
        [str(python), "-m", "pip", "list", "--format", "json", "--disable-pip-version-check"], timeout=120
    )
    return {row["name"].lower(): row["version"] for row in json.loads(out.stdout)}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    """Both wheels (and sdists), built by ``uv build --all-packages`` from this checkout."""
    dist = tmp_path_factory.mktemp("dist")
    _run(
        [_uv(), "build", "--all-packages", "--quiet", "-o", str(dist)],
        timeout=600,
        cwd=REPO,
        env=_clean_env(),
    )
    built = {p.name.split("-")[0]: p for p in dist.glob("*.whl")}
    assert set(built) == {"airflow_provider_dlq", "pulsar_dlq_consumer"}, built
    return built


def test_library_wheel_alone_passes_its_tests(wheels, tmp_path, pulsar_broker, record_figure):
    python = _fresh_venv_with(
        tmp_path / "venv", [str(wheels["pulsar_dlq_consumer"]), *TEST_TOOLS], "library venv", record_figure
    )
    installed = _installed(python)
    assert installed["pulsar-dlq-consumer"] == "0.1.0"
    assert "pulsar-client" in installed
    assert not [name for name in installed if "airflow" in name or "pyspark" in name], installed
    probe = (
        "import importlib.util, pulsar_dlq_consumer;"
        "print(pulsar_dlq_consumer.__file__);"
        "print([m for m in ('airflow', 'pyspark', 'airflow_provider_dlq') if importlib.util.find_spec(m)])"
    )
    where, importable = _run([str(python), "-c", probe], timeout=60, cwd=tmp_path).stdout.splitlines()
    assert where.startswith(str(tmp_path / "venv")), where
    assert importable == "[]"

    ignores = [f"--ignore={path}" for path in NEEDS_PROVIDER]
    env = _clean_env(
        DLQ_TEST_PULSAR_SERVICE_URL=pulsar_broker.service_url,
        DLQ_TEST_PULSAR_ADMIN_URL=pulsar_broker.admin_url,
    )
    # The venv's pytest script (not ``python -m``): the checkout's folders stay off sys.path, so the
    # tests import the installed wheel.
    result = subprocess.run(
        [str(python.parent / "pytest"), *LIBRARY_TESTS, *ignores, "-q", "-p", "no:cacheprovider", "-x"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    record_figure(f"library tests in the library venv: {summary}")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in summary, summary
    assert "skipped" not in summary, summary


_PYSPARK_RECORD_CHECK = """
import base64, hashlib, importlib.metadata as md, json, sys
dist = md.distribution("pyspark")
checked, bad = 0, []
for f in dist.files:
    if f.hash is None:
        continue
    data = f.locate().read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.new(f.hash.mode, data).digest()).rstrip(b"=").decode()
    checked += 1
    if digest != f.hash.value:
        bad.append(str(f))
others, shared = [], set()
for d in md.distributions():
    mine = [str(p) for p in (d.files or []) if str(p).startswith("pyspark/")]
    if d.metadata["Name"].lower() != "pyspark" and mine:
        others.append(d.metadata["Name"])
        shared.update(mine)
print(json.dumps({
    "checked": checked,
    "bad": bad,
    "bad_not_shared": sorted(set(bad) - shared),
    "others_writing_pyspark": sorted(others),
}))
"""

_TOP_LEVEL_CHECK = """
import importlib.metadata as md, importlib.util, json
files = md.distribution("airflow-provider-dlq").files
tops = sorted({str(f).split("/")[0] for f in files if not str(f).split("/")[0].endswith(".dist-info")})
generic = importlib.util.find_spec("spark_apps") is not None
print(json.dumps({"top_level": tops, "spark_apps_importable": generic}))
"""


def _fill_dlq(client, origin: str) -> tuple[DlqConsumer, int]:
    """An orders service that terms 3 orders (2 timeouts, 1 missing currency) into its DLQ."""
    service = DlqConsumer(
        client,
        origin,
        "orders-service",
        dead_letter_policy=DeadLetterPolicy(initial_subscription_name=SUB),
        initial_position=pulsar.InitialPosition.Earliest,
    )
    producer = client.create_producer(origin)
    errors = [
        TimeoutError("payment timed out"),
        TimeoutError("payment timed out"),
        ValueError("missing currency"),
    ]
    for i in range(len(errors)):
        producer.send(json.dumps({"order": i, "total": 10}).encode(), properties={"n": str(i)})
    producer.close()
    for _ in errors:
        msg = service.receive(timeout_millis=10_000)
        service.term(msg, errors[int(msg.properties()["n"])])
    service.flush()
    return service, len(errors)


def _pending(client, topic: str) -> int:
    consumer = client.subscribe(topic, SUB, consumer_type=pulsar.ConsumerType.Shared)
    count = 0
    try:
        while True:
            consumer.receive(timeout_millis=3000)
            count += 1
    except pulsar.Timeout:
        return count
    finally:
        consumer.close()


# pyspark is published only as a 456 MB source package: a cold pip cache downloads and builds it (more
# than 15 minutes on a busy 2-core machine); pip's wheel cache makes later runs take a few minutes.
@pytest.mark.timeout(3600)
def test_provider_wheel_installs_cleanly_and_runs_a_dry_run(
    wheels, tmp_path, pulsar_broker, pulsar_client, topic_factory, record_figure
):
    provider = f"airflow-provider-dlq[pyspark] @ {wheels['airflow_provider_dlq'].as_uri()}"
    python = _fresh_venv_with(
        tmp_path / "venv",
        [provider, str(wheels["pulsar_dlq_consumer"])],
        "provider venv (extra pyspark)",
        record_figure,
    )
    venv_bin = python.parent

    installed = _installed(python)
    assert "pyspark" in installed
    spark_provider = installed["apache-airflow-providers-apache-spark"]
    assert int(spark_provider.split(".")[0]) >= 6, spark_provider  # the newest line: pyspark-client too
    assert "pyspark-client" in installed
    _run([str(python), "-m", "pip", "check", "--disable-pip-version-check"], timeout=120)

    # pip writes pyspark-client after pyspark: the Python files both ship are pyspark-client's (older)
    # ones, nothing else of pyspark changed.
    record = json.loads(_run([str(python), "-c", _PYSPARK_RECORD_CHECK], timeout=300, cwd=tmp_path).stdout)
    assert record["checked"] > 1000, record
    assert record["bad_not_shared"] == [], record
    assert record["others_writing_pyspark"] == ["pyspark-client"], record
    record_figure(
        f"Spark provider {spark_provider}, pyspark {installed['pyspark']}, pyspark-client "
        f"{installed['pyspark-client']}: {record['checked'] - len(record['bad'])} of {record['checked']} "
        f"pyspark files as its RECORD says; the other {len(record['bad'])} are pyspark-client's"
    )
    # spark-submit runs pyspark's own files all the same (the venv's pytest, the root conftest left out).
    _run([str(python), "-m", "pip", "install", "--disable-pip-version-check", *TEST_TOOLS], timeout=600)
    files_test = REPO / "tests" / "integration" / "packaging" / "test_pyspark_files.py"
    _run(
        [str(python.parent / "pytest"), str(files_test), "-q", "-p", "no:cacheprovider",
         f"--confcutdir={files_test.parent}"],
        timeout=900,
        cwd=REPO,
        env=_clean_env(PATH=f"{python.parent}{os.pathsep}{_clean_env()['PATH']}"),
    )  # fmt: skip

    layout = json.loads(_run([str(python), "-c", _TOP_LEVEL_CHECK], timeout=60, cwd=tmp_path).stdout)
    assert layout == {"top_level": ["airflow_provider_dlq"], "spark_apps_importable": False}, layout

    # The example DAGs, playbook and fix, from the installed provider.
    dags = Path(
        _run([str(python), "-m", "airflow_provider_dlq.examples"], timeout=60, cwd=tmp_path).stdout.strip()
    )
    assert dags.is_relative_to(tmp_path / "venv"), dags
    assert (dags / "dlq_backfill.py").is_file()
    playbook = dags / "playbooks" / "orders.yaml"
    assert playbook.is_file()
    assert (dags / "fixes" / "orders_fixes.py").is_file()

    origin = topic_factory("orders", "acme/shop")
    service, count = _fill_dlq(pulsar_client, origin)
    airflow_home, data_dir, jvm_tmp = tmp_path / "airflow", tmp_path / "dlq", tmp_path / "jvm-tmp"
    jvm_tmp.mkdir()
    env = _clean_env(
        PATH=f"{venv_bin}{os.pathsep}{_clean_env()['PATH']}",
        VIRTUAL_ENV=str(tmp_path / "venv"),
        AIRFLOW_HOME=str(airflow_home),
        AIRFLOW__CORE__DAGS_FOLDER=str(dags),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{airflow_home / 'airflow.db'}",
        AIRFLOW_CONN_PULSAR_DEFAULT=json.dumps({"conn_type": "pulsar", "host": pulsar_broker.service_url}),
        AIRFLOW_CONN_SPARK_DEFAULT=json.dumps({"conn_type": "spark", "host": "local[2]"}),
        DLQ_DATA_DIR=str(data_dir),
        DLQ_REPLAY_RETRIES="0",
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=str(python),
        PYSPARK_DRIVER_PYTHON=str(python),
        SPARK_HOME="",
        # The driver's Spark dirs and natives, and this venv's class-data archive, stay in the test's
        # temp dir (the archive is keyed by the venv's path: every run of this test would add one).
        SPARK_SUBMIT_OPTS=f"-Djava.io.tmpdir={jvm_tmp}",
        XDG_CACHE_HOME=str(tmp_path / "cache"),
    )
    env.pop("SPARK_HOME")
    _run([str(venv_bin / "airflow"), "db", "migrate"], timeout=600, env=env, cwd=tmp_path)
    conf = {"topics": [service.dead_letter_topic], "playbook": str(playbook), "origin_allowlist": origin}
    started = time.monotonic()
    _run(
        [str(venv_bin / "airflow"), "dags", "test", "dlq_backfill", "-c", json.dumps(conf)],
        timeout=900,
        env=env,
        cwd=tmp_path,
    )
    record_figure(f"dry-run of the installed dlq_backfill DAG: {time.monotonic() - started:.0f} s")

    reports = list(data_dir.glob("runs/*/report.json"))
    assert len(reports) == 1, reports
    report = json.loads(reports[0].read_text())
    assert report["mode"] == "dry-run"
    assert report["totals"]["snapshot"] == count
    assert report["totals"]["acked"] == 0
    assert report["totals"]["left_pending"] == count
    assert _pending(pulsar_client, service.dead_letter_topic) == count  # a dry run changes nothing
    service.close()
