"""The replay app through real ``spark-submit`` of the bundle: --help, kill -9 mid-apply and mid-commit
then resume (same end state), and a 100k-message replay with exact counts and measured figures."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest
from replay_e2e_support import PLAYBOOK, close_driver_clients, drain, order, ours, pending_on, read_all

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True, scope="module")
def _close_clients_after_module():
    yield
    close_driver_clients()


LOG = logging.getLogger("tests.replay.submit")
SPARK_CONF = [
    "--master", "local[2]", "--driver-memory", "2g",
    "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=4",
]  # fmt: skip


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    from airflow_provider_dlq.bundle import build_bundle

    return build_bundle(tmp_path_factory.mktemp("bundle"))


def spark_submit() -> str:
    return str(Path(sys.executable).parent / "spark-submit")


def start(
    bundle, args: list[str], workdir: Path, name: str, conf: tuple[str, ...] = ()
) -> subprocess.Popen[bytes]:
    cmd = [
        spark_submit(),
        *SPARK_CONF,
        *conf,
        "--py-files",
        str(bundle.zip_path),
        str(bundle.main_path),
        *args,
    ]
    out = open(workdir / f"{name}.out", "wb")  # noqa: SIM115 - closed with the process
    err = open(workdir / f"{name}.err", "wb")  # noqa: SIM115
    return subprocess.Popen(cmd, cwd=workdir, stdout=out, stderr=err, start_new_session=True)


def finish(proc: subprocess.Popen[bytes], workdir: Path, name: str, timeout: float = 600) -> dict[str, Any]:
    code = proc.wait(timeout=timeout)
    out = (workdir / f"{name}.out").read_text()
    assert code == 0, f"{name} exited {code}:\n{(workdir / f'{name}.err').read_text()[-4000:]}\n{out[-2000:]}"
    last = out.strip().splitlines()[-1]
    assert last.startswith("DLQ_REPLAY_SUMMARY ")
    return json.loads(last[len("DLQ_REPLAY_SUMMARY ") :])


def args_for(broker: Any, dlq: str, out: Path, run_id: str, *extra: str) -> list[str]:
    """The app's arguments on ``broker`` (its admin URL: the reader mode, one DLQ read per message)."""
    return [
        "--run-id", run_id, "--mode", "replay", "--service-url", broker.service_url,
        "--admin-url", broker.admin_url, "--topics", dlq,
        "--output-dir", str(out), "--playbook", PLAYBOOK, "--origin-allowlist", "orders-*",
        "--idle-timeout-ms", "1500", *extra,
    ]  # fmt: skip


def produce(client, topic: str, items: list[tuple[str, bytes, dict[str, str]]], batching: bool) -> None:
    """Async sends (batched or not), every result checked."""
    producer = client.create_producer(
        topic,
        batching_enabled=batching,
        batching_max_messages=1000,
        block_if_queue_full=True,
        max_pending_messages=5000,
    )
    import pulsar

    failures: list[Any] = []
    lock = threading.Lock()

    def done(res, _msg_id):
        if res != pulsar.Result.Ok:
            with lock:
                failures.append(res)

    for key, payload, props in items:
        producer.send_async(payload, done, properties=props, partition_key=key)
    producer.flush()
    producer.close()
    assert not failures, f"{len(failures)} sends failed: {failures[:3]}"


def small_dlq(client, n_replay: int, n_archive: int, n_skip: int) -> tuple[str, str, dict[str, str]]:
    u = uuid.uuid4().hex[:8]
    orders = f"persistent://public/default/orders-{u}"
    dlq = f"persistent://public/default/orders-{u}-sub-DLQ"
    items, expected = [], {}
    for i in range(n_replay):
        items.append((f"t-{i}", order(i), ours(orders, "TimeoutError", f"timed out after {i}s")))
        expected[f"t-{i}"] = "republished"
    for i in range(n_archive):
        items.append((f"a-{i}", b"<xml/>", ours(orders, "json.decoder.JSONDecodeError", "Expecting value")))
        expected[f"a-{i}"] = "archived"
    for i in range(n_skip):
        items.append((f"s-{i}", order(i), ours(orders, "RuntimeError", "unknown")))
        expected[f"s-{i}"] = "skipped"
    # Not batched: every DLQ message is its own entry, so acks are exact per message (see the 100k test).
    produce(client, dlq, items, batching=False)
    return orders, dlq, expected


def check_end_state(spark, client, orders: str, dlq: str, out: Path, run_id: str, expected: dict[str, str]):
    """Every message has its one outcome: republished (maybe twice without broker dedup), archived once,
    skipped ones pending, everything final acked, one ledger row per message."""
    republished = drain(client, orders, f"verify-{uuid.uuid4().hex[:6]}")
    keys = [m.partition_key() for m in republished]
    want = {k for k, v in expected.items() if v == "republished"}
    assert set(keys) == want
    assert {m.properties()["REPLAY_RUN_ID"] for m in republished} == {run_id}
    pending = sorted(m.partition_key() for m in drain(client, dlq, "dlq-replayer"))
    assert pending == sorted(k for k, v in expected.items() if v == "skipped")
    archived = spark.read.parquet(str(out / "archive")).select("key").collect()
    assert sorted(r["key"] for r in archived) == sorted(k for k, v in expected.items() if v == "archived")
    ledger = spark.read.parquet(str(out / "ledger"))
    assert ledger.count() == len(expected)
    assert {r["outcome"]: r["count"] for r in ledger.groupBy("outcome").count().collect()} == {
        o: list(expected.values()).count(o) for o in set(expected.values())
    }
    return len(keys) - len(want)  # duplicates (none under broker dedup)


def test_spark_submit_help_documents_every_option(bundle, tmp_path):
    out = subprocess.run(
        [spark_submit(), "--master", "local[1]", "--py-files", str(bundle.zip_path), str(bundle.main_path),
         "--help"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    for option in (
        "--run-id",
        "--mode",
        "--origin-allowlist",
        "--archive-payload",
        "--max-replays",
        "--rate-limit",
    ):
        assert option in out.stdout


def test_cli_contract_exit_codes_and_streams(spark, pulsar_client, pulsar_broker, bundle, tmp_path):
    """Under spark-submit (whose ``PythonRunner`` merges the Python driver's stderr into stdout): progress
    and errors in the driver's output, the summary its last stdout line, exit codes 0 and 2."""
    _, dlq, _ = small_dlq(pulsar_client, n_replay=5, n_archive=0, n_skip=3)
    out = tmp_path / "out"
    ok = start(bundle, args_for(pulsar_broker, dlq, out, "contract", "--mode", "dry-run"), tmp_path, "ok")
    summary = finish(ok, tmp_path, "ok")
    assert summary["totals"]["snapshot"] == 8
    stdout = (tmp_path / "ok.out").read_text()
    output = stdout + (tmp_path / "ok.err").read_text()
    assert "step plan: started" in output
    assert "step report: complete" in output
    assert stdout.strip().splitlines()[-1].startswith("DLQ_REPLAY_SUMMARY ")
    # Invalid input: exit 2, the problem on stderr, nothing written for the new run id.
    bad = start(
        bundle,
        args_for(pulsar_broker, dlq, out, "contract-bad", "--origin-allowlist", "re:orders(["),
        tmp_path,
        "bad",
    )
    assert bad.wait(timeout=600) == 2
    assert (
        "invalid regular expression"
        in (tmp_path / "bad.err").read_text() + (tmp_path / "bad.out").read_text()
    )
    assert "DLQ_REPLAY_SUMMARY" not in (tmp_path / "bad.out").read_text()
    assert not (out / "runs" / "contract-bad").exists()
    # A resume with changed options: exit 2, not the resumable 1.
    changed = start(
        bundle,
        args_for(pulsar_broker, dlq, out, "contract", "--mode", "dry-run", "--max-replays", "5"),
        tmp_path,
        "changed",
    )
    assert changed.wait(timeout=600) == 2
    assert (
        "changed: max_replays"
        in (tmp_path / "changed.err").read_text() + (tmp_path / "changed.out").read_text()
    )


def test_class_data_archive_written_by_a_real_run_then_mapped(pulsar_client, pulsar_broker, bundle, tmp_path):
    """The operator's JVM class-data archive with a real driver JVM: the first run writes it (stdout still
    ends with the summary line: the JVM's hundreds of class-data warnings stay off it), it is installed
    after exit 0, and the next run maps it (both wall times are printed, not asserted)."""
    from airflow_provider_dlq.class_data import DRIVER_JAVA_OPTIONS, ClassDataArchive

    cache = ClassDataArchive(tmp_path / "cds")
    seconds = []
    for run in ("write", "map"):
        plan = cache.plan()
        assert plan is not None
        assert (plan.writing is not None) == (run == "write")
        _, dlq, _ = small_dlq(pulsar_client, n_replay=5, n_archive=0, n_skip=3)
        args = args_for(pulsar_broker, dlq, tmp_path / "out", f"cds-{run}", "--mode", "dry-run")
        conf = ("--conf", f"{DRIVER_JAVA_OPTIONS}={plan.java_options()}")
        started = time.monotonic()
        proc = start(bundle, args, tmp_path, run, conf)
        summary = finish(proc, tmp_path, run)
        seconds.append(time.monotonic() - started)
        assert summary["totals"]["snapshot"] == 8
        assert "[cds]" not in (tmp_path / f"{run}.out").read_text()
        assert plan.finish(succeeded=True) == (run == "write")
        assert plan.path.is_file()
    assert not list((tmp_path / "cds").glob("*.tmp"))
    print(f"class-data archive: writing run {seconds[0]:.1f} s, mapping run {seconds[1]:.1f} s")


def test_compiled_pyspark_imported_by_a_real_runs_driver_and_workers(
    pulsar_client, pulsar_broker, bundle, tmp_path
):
    """The operator's compiled PySpark with real spark-submit: the copy's ``pyspark/__init__.py`` is made
    to note each process that imports it, and a replay run must list its driver and its workers' daemon
    (spark-submit's own ``pyspark.zip`` would note nothing). The run's result is unchanged."""
    from airflow_provider_dlq.compiled_pyspark import DAEMON_MODULE, CompiledPySpark

    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    env.pop("PYTHONPATH", None)
    env.pop("SPARK_HOME", None)  # as on an Airflow worker: spark-submit's launcher finds Spark itself
    copy = CompiledPySpark(tmp_path / "compiled").prepare("local[2]", env, {})
    assert copy is not None
    init = copy.folder / "pyspark" / "__init__.py"
    noted = tmp_path / "imported-by.txt"
    with init.open("a", encoding="utf-8") as handle:  # the source changed: Python recompiles it, once
        handle.write(
            "\nimport os as _os, sys as _sys\n"
            "with open(_os.environ['DLQ_TEST_IMPORTS'], 'a') as _f:\n"
            "    _f.write(_os.path.basename(_sys.argv[0]) + '\\n')\n"
        )
    _, dlq, _ = small_dlq(pulsar_client, n_replay=5, n_archive=2, n_skip=3)
    args = args_for(pulsar_broker, dlq, tmp_path / "out", "compiled", "--mode", "dry-run")
    cmd = [
        spark_submit(), *SPARK_CONF,
        *(arg for key, value in copy.conf({}).items() for arg in ("--conf", f"{key}={value}")),
        "--py-files", str(bundle.zip_path), str(bundle.main_path), *args,
    ]  # fmt: skip
    with (tmp_path / "compiled.out").open("wb") as out, (tmp_path / "compiled.err").open("wb") as err:
        proc = subprocess.Popen(
            cmd,
            cwd=tmp_path,
            stdout=out,
            stderr=err,
            start_new_session=True,
            env={**copy.env(env), "DLQ_TEST_IMPORTS": str(noted)},
        )
    summary = finish(proc, tmp_path, "compiled")
    assert summary["totals"]["snapshot"] == 10
    importers = noted.read_text().split()
    assert sorted(set(importers)) == sorted({bundle.main_path.name, f"{DAEMON_MODULE}.py"}), importers


# A SIGKILL in each of the seven steps, then the resume (lost / doubled / pending / resent counted on
# Apache Pulsar with broker dedup), is the fault suite's `kill` category: tests/integration/faults.


@pytest.mark.slow
def test_100k_messages_exact_counts_and_figures(spark, pulsar_client, pulsar_broker, bundle, tmp_path):
    u = uuid.uuid4().hex[:8]
    orders = f"persistent://public/default/orders-{u}"
    dlq = f"persistent://public/default/orders-{u}-sub-DLQ"
    kinds = [  # (count, key prefix, payload, properties, outcome)
        (70_000, "t", order(1), ours(orders, "TimeoutError", "inventory timed out after 30s"), "republished"),
        (
            10_000,
            "f",
            order(2),
            ours(orders, "ValueError", "missing currency in order ORD-000002"),
            "republished",
        ),
        (
            5_000,
            "x",
            order(3, amount=-1),
            ours(orders, "ValueError", "missing currency in order ORD-3"),
            "fix_failed",
        ),
        (5_000, "a", b"<xml/>", ours(orders, "json.decoder.JSONDecodeError", "Expecting value"), "archived"),
        (5_000, "s", order(4), {"REAL_TOPIC": orders, "ORIGIN_MESSAGE_ID": "1:1:-1:-1"}, "skipped"),
        (5_000, "m", order(5), {"junk": "1"}, "malformed"),
    ]
    # Every message is its own original: a distinct origin message id where the convention has one.
    items = [
        (
            f"{prefix}-{i}",
            payload,
            {**props, "ORIGIN_MESSAGE_ID": f"{k}:{i}:-1:-1"} if "ORIGIN_MESSAGE_ID" in props else props,
        )
        for k, (n, prefix, payload, props, _) in enumerate(kinds)
        for i in range(n)
    ]
    produce(pulsar_client, dlq, items, batching=True)
    out = tmp_path / "out"
    peaks = {"jvm": 0, "python_driver": 0}
    stop = threading.Event()
    proc = start(bundle, args_for(pulsar_broker, dlq, out, "big-1"), tmp_path, "big")

    def sample() -> None:
        root = psutil.Process(proc.pid)
        while not stop.is_set():
            try:
                peaks["jvm"] = max(peaks["jvm"], root.memory_info().rss)
                for child in root.children():
                    if child.name().startswith("python") and "dlq_replay_main" in " ".join(child.cmdline()):
                        peaks["python_driver"] = max(peaks["python_driver"], child.memory_info().rss)
            except psutil.Error:
                pass
            stop.wait(0.25)

    sampler = threading.Thread(target=sample, daemon=True)
    started = time.monotonic()
    sampler.start()
    try:
        summary = finish(proc, tmp_path, "big", timeout=900)
    finally:
        wall = time.monotonic() - started
        stop.set()
        sampler.join()
    totals = summary["totals"]
    assert totals["snapshot"] == 100_000
    assert totals["republished"] == 80_000
    assert totals["fix_failed"] == 5_000
    assert totals["archived"] == 5_000
    assert totals["skipped"] == 5_000
    assert totals["malformed"] == 5_000
    report = json.loads((out / "runs" / "big-1" / "report.json").read_text())
    commit = report["commit"]
    # One DLQ read per message: Readers for the snapshot, acks by entry id for the commit. A batched
    # entry mixing final and pending messages is never acked: its final messages wait, counted.
    assert (commit["read_mode"], commit["reads_per_message"], commit["unacked_final"]) == ("reader", 1.0, 0)
    assert totals["acked"] + commit["final_in_partial_entries"] == 85_000
    assert commit["left_pending_seen"] == 15_000
    assert totals["left_pending"] == 15_000
    assert totals["publish_failed"] == 0
    figures = {
        "messages": 100_000,
        "wall_s": round(wall, 1),
        "msg_per_s": round(100_000 / wall),
        "jvm_peak_rss_mb": round(peaks["jvm"] / 2**20),
        "python_driver_peak_rss_mb": round(peaks["python_driver"] / 2**20),
        "timings": report["timings"],
    }
    (tmp_path / "figures.json").write_text(json.dumps(figures))
    LOG.warning("100k replay figures: %s", json.dumps(figures))
    print("REPLAY_100K_FIGURES", json.dumps(figures))
    # Readers (and the cursor) verify: a Shared consumer that acks nothing stops at 50,000 messages.
    replayed = read_all(pulsar_client, orders)
    assert len(replayed) == 80_000
    assert len({m.properties()["REPLAY_ID"] for m in replayed}) == 80_000
    assert os.path.exists(out / "runs" / "big-1" / "report.html")
    # The DLQ was written in batches. Without batch-index acks a broker deletes a batch only once all of
    # its messages are acked, so a batch mixing final and pending messages is delivered again, whole.
    pending = pending_on(pulsar_client, pulsar_broker.admin_url, dlq)
    outcome_of = {
        key: outcome for n, prefix, _, _, outcome in kinds for key in (f"{prefix}-{i}" for i in range(n))
    }
    still = [m.partition_key() for m in pending]
    assert len(still) == len(set(still))
    pending_kinds = {"fix_failed", "skipped", "malformed"}
    assert {k for k, o in outcome_of.items() if o in pending_kinds} <= set(still)
    extra = [k for k in still if outcome_of[k] not in pending_kinds]
    assert len(extra) < 6 * 1000  # at most the batches at the 5 boundaries between final and pending kinds
    assert len(extra) == commit["final_in_partial_entries"]  # the commit counted them exactly
    # A second run treats those as already final (acks them again), acts on nothing twice.
    from spark_apps.dlq_replay.options import ReplayOptions
    from spark_apps.dlq_replay.runner import run_replay

    again = run_replay(
        spark,
        ReplayOptions(
            run_id="big-2", mode="replay", service_url=pulsar_broker.service_url, topics=(dlq,),
            admin_url=pulsar_broker.admin_url, output_dir=str(out),
            playbook=PLAYBOOK, origin_allowlist=("orders-*",), idle_timeout_ms=1500,
        ),
    )  # fmt: skip
    assert again["totals"]["snapshot"] == len(still)
    assert again["totals"]["already_final"] == len(extra)
    assert again["totals"]["republished"] == 0
    assert again["commit"]["read_mode"] == "reader"
    assert len(read_all(pulsar_client, orders)) == 80_000
