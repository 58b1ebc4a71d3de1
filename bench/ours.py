"""Run "ours": the replay app through ``spark-submit`` (``--master`` or, for Spark Connect, ``--remote``),
end to end, then verify it, reading its report, archive and ledger from its output root."""

from __future__ import annotations

import json
import os
import shutil
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import verify, workload
from bench.masters import is_remote
from bench.output_root import OutputRoot, local_root
from bench.playbook import write_playbook
from bench.procmon import run_sampled
from bench.pulsar_io import BenchError
from bench.results_model import RunResult
from pulsar_dlq_consumer.replay_options import SUMMARY_PREFIX

if TYPE_CHECKING:
    from collections.abc import Callable

    from airflow_provider_dlq.driver_footprint import QuickJit


def spark_submit_path() -> str:
    """``spark-submit`` from PATH, else next to this Python (the venv's ``bin``)."""
    found = shutil.which("spark-submit") or str(Path(sys.executable).parent / "spark-submit")
    if not Path(found).exists():
        raise BenchError(
            "spark-submit not found; run `source scripts/env.sh` first (it puts the venv on PATH)"
        )
    return found


def spark_env() -> dict[str, str]:
    """The environment spark-submit needs here: the venv's Python for driver and workers, loopback."""
    env = dict(os.environ)
    env["PYSPARK_PYTHON"] = env.get("PYSPARK_PYTHON", sys.executable)
    env["PYSPARK_DRIVER_PYTHON"] = env.get("PYSPARK_DRIVER_PYTHON", sys.executable)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    env.pop("PYTHONPATH", None)  # the app must run from its bundle alone
    return env


def build_command(
    *,
    service_url: str,
    admin_url: str | None = None,
    run_id: str,
    zip_path: Path,
    main_path: Path,
    playbook: Path,
    output_dir: Path | str,
    master: str,
    spark_conf: list[str],
    app_args: list[str],
) -> list[str]:
    """The spark-submit command line, exactly as the Airflow operator builds it (plus bench options). A
    Spark Connect ``master`` (``sc://...``) is submitted with ``--remote`` and ``spark.api.mode=connect``
    (spark-submit hands its Python driver ``SPARK_REMOTE`` only then)."""
    confs: list[str] = ["--conf", "spark.ui.enabled=false"]
    for item in spark_conf:
        if "=" not in item:
            raise BenchError(f"--spark-conf {item!r} must be KEY=VALUE")
        confs += ["--conf", item]
    where = (
        ["--remote", master, "--conf", "spark.api.mode=connect"]
        if is_remote(master)
        else ["--master", master]
    )
    return [
        spark_submit_path(),
        *where,
        *confs,
        "--py-files",
        str(zip_path),
        str(main_path),
        "--run-id",
        run_id,
        "--mode",
        "replay",
        "--service-url",
        service_url,
        "--topics",
        ",".join(workload.DLQ_TOPICS),
        "--subscription",
        workload.DLQ_SUBSCRIPTION,
        "--playbook",
        str(playbook),
        "--output-dir",
        str(output_dir),
        "--origin-allowlist",
        workload.ORIGIN_ALLOWLIST,
        *(["--admin-url", admin_url] if admin_url else []),
        *app_args,
    ]


def with_conf(items: list[str], change: Callable[[dict[str, str]], dict[str, str]]) -> list[str]:
    """``KEY=VALUE`` items after ``change`` of their mapping (order kept, new keys last)."""
    conf: dict[str, str] = {}
    for item in items:
        if "=" not in item:
            raise BenchError(f"--spark-conf {item!r} must be KEY=VALUE")
        key, value = item.split("=", 1)
        conf[key] = value
    return [f"{key}={value}" for key, value in change(conf).items()]


def run_ours(
    *,
    service_url: str,
    admin_url: str | None = None,
    n: int,
    workdir: Path,
    log_path: Path,
    master: str = "local[2]",
    spark_conf: list[str] | None = None,
    app_args: list[str] | None = None,
    timeout_s: float | None = None,
    contender: str = "ours",
    adopted_parents: tuple[int, ...] = (),
    adopted_roots: tuple[int, ...] = (),
    output: OutputRoot | None = None,
    class_data_archive: bool = True,
    quick_jit: QuickJit = "auto",
    compiled_pyspark: bool = True,
) -> RunResult:
    """Submit the replay app against a broker holding ``n`` DLQ messages; time, sample and verify it.

    ``master`` is a Spark master or a Spark Connect URL (``sc://...``, submitted with ``--remote``);
    ``adopted_parents`` and ``adopted_roots`` add a cluster's executors or a Connect server to the sampled
    tree (:func:`bench.procmon.run_sampled`). ``output`` is the output root (default ``workdir/out``); its
    environment (an S3 server's keys and endpoint) is added to spark-submit's, never to its arguments, and
    the report, archive and ledger are read back from it.

    With ``class_data_archive`` the driver JVM starts from the operator's managed class-data archive
    (:mod:`airflow_provider_dlq.class_data`), written by this run when there is none yet; ``quick_jit``
    chooses the driver's JIT as the operator does (:mod:`airflow_provider_dlq.driver_footprint`), ``n`` being
    an exact count; a local ``master`` gets the operator's lean driver
    (:mod:`airflow_provider_dlq.driver_footprint`) and, with ``compiled_pyspark``, its compiled PySpark
    (:mod:`airflow_provider_dlq.compiled_pyspark`, made before the timed run when there is none yet).
    """
    from airflow_provider_dlq.bundle import build_bundle
    from airflow_provider_dlq.class_data import ClassDataArchive
    from airflow_provider_dlq.compiled_pyspark import CompiledPySpark
    from airflow_provider_dlq.driver_footprint import (
        lean_driver_conf,
        lean_driver_env,
        quick_jit_chosen,
        with_quick_jit,
    )

    output = output or local_root(workdir)
    bundle = build_bundle(workdir / "bundle")
    playbook = write_playbook(workdir / "playbook.yaml")
    run_id = f"bench-{n}"
    archive = ClassDataArchive().plan(spark_env()) if class_data_archive else None
    conf = with_conf(list(spark_conf or []), lambda given: lean_driver_conf(given, master))
    quick = quick_jit_chosen(quick_jit, master)
    if quick:
        conf = with_conf(conf, with_quick_jit)
    if archive is not None:
        conf = with_conf(conf, archive.conf)
    env = lean_driver_env(spark_env(), master)
    compiled = (
        CompiledPySpark().prepare(master, env, dict(c.split("=", 1) for c in conf))
        if compiled_pyspark
        else None
    )
    if compiled is not None:
        conf = with_conf(conf, compiled.conf)
        env = compiled.env(env)
    env.update(output.env)
    cmd = build_command(
        service_url=service_url,
        admin_url=admin_url,
        run_id=run_id,
        zip_path=bundle.zip_path,
        main_path=bundle.main_path,
        playbook=playbook,
        output_dir=output.uri,
        master=master,
        spark_conf=conf,
        app_args=app_args or [],
    )
    with log_path.open("w", encoding="utf-8") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        run = run_sampled(
            cmd,
            log,
            what="the replay app",
            timeout_s=timeout_s,
            env=env,
            cwd=workdir,
            adopted_parents=adopted_parents,
            adopted_roots=adopted_roots,
        )
        log.write("\n--- stdout ---\n" + run.stdout)
    if archive is None:
        archive_use = "off"
    elif archive.writing is None:
        archive_use = "used"
    else:
        archive_use = "written" if archive.finish(run.returncode == 0) else "write failed"
    if run.returncode != 0:
        raise BenchError(f"the replay app exited with {run.returncode}; see {log_path}")
    location, report = _load_report(run.stdout, log_path, output)
    timings = {k: float(v) for k, v in report.get("timings", {}).items()}

    check = verify.Verification()
    check.expect("report.in_output_root", location.startswith(output.uri.rstrip("/") + "/"), True)
    verify.verify_app_outputs(report, n, check, output)
    check.expect("report.groups", len(list(verify.groups_of(report))), min(n, workload.SIGNATURE_COUNT))
    verify.verify_origins(service_url, n, mode="replay", lineage=True, result=check)
    verify.verify_pending(service_url, check)
    return RunResult(
        contender=contender,
        n=n,
        measured_n=n,
        wall_s=run.wall_s,
        work_s=app_seconds(report, timings),
        ok=check.ok,
        memory_mib=run.peaks.as_mib(),
        checks=check.checks,
        errors=check.errors,
        details={
            "timings": timings,
            "steps_s": round(sum(timings.values()), 3),
            "totals": report.get("totals"),
            "memory_samples": run.peaks.samples,
            "master": master,
            "output_root": output.kind,
            "output_dir": output.uri,
            "class_data_archive": archive_use,
            "compiled_pyspark": "used" if compiled is not None else "off",
            "quick_jit": quick,
        },
    )


def app_seconds(report: dict[str, Any], timings: dict[str, float]) -> float:
    """The app's own run time, JVM and session start-up and shut-down excluded: the sum of its step
    timings (the steps run one after the other; ``report`` includes its aggregation, which the report's
    ``finished_at`` does not). Falls back to ``finished_at - started_at`` without timings."""
    if timings:
        return sum(timings.values())
    try:
        started = datetime.fromisoformat(str(report["started_at"]))
        finished = datetime.fromisoformat(str(report["finished_at"]))
    except (KeyError, ValueError):
        return 0.0
    return max(0.0, (finished - started).total_seconds())


def _load_report(stdout: str, log_path: Path, output: OutputRoot) -> tuple[str, dict[str, Any]]:
    """``(location, report)``: the report.json the summary line names, read from the output root."""
    lines = [line for line in stdout.splitlines() if line.startswith(SUMMARY_PREFIX)]
    if not lines:
        raise BenchError(f"the replay app printed no {SUMMARY_PREFIX.strip()} line; see {log_path}")
    summary = json.loads(lines[-1][len(SUMMARY_PREFIX) :])
    location = str(summary.get("paths", {}).get("report_json", ""))
    data = output.read_bytes(location) if location else None
    if data is None:
        raise BenchError(f"report.json not found at {location!r}; see {log_path}")
    report: dict[str, Any] = json.loads(data)
    return location, report
