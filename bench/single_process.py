"""Run a single-process contender in its own Python process, timed and memory-sampled."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench import verify, workload
from bench.contenders import RESULT_MARKER, ContenderSpec
from bench.procmon import run_sampled
from bench.pulsar_io import BenchError
from bench.results_model import RunResult


def run_single_process(
    name: str,
    *,
    service_url: str,
    n: int,
    workdir: Path,
    log_path: Path,
    idle_timeout_s: float,
    timeout_s: float | None = None,
    settings: dict[str, Any] | None = None,
) -> RunResult:
    """Run contender ``name`` on a broker holding ``n`` DLQ messages, then verify the end state."""
    archive = workdir / "archive.jsonl"
    spec = ContenderSpec(
        service_url=service_url,
        dlq_topics=workload.DLQ_TOPICS,
        backlog=tuple(workload.backlog_per_dlq(n)[t] for t in workload.DLQ_TOPICS),
        subscription=workload.DLQ_SUBSCRIPTION,
        archive_path=str(archive),
        idle_timeout_s=idle_timeout_s,
        settings=dict(settings or {}),
    )
    cmd = [sys.executable, "-m", "bench.contenders", name, json.dumps(spec.to_json())]
    with log_path.open("w", encoding="utf-8") as log:
        run = run_sampled(cmd, log, what=name, timeout_s=timeout_s)
    if run.returncode != 0:
        raise BenchError(f"{name} exited with {run.returncode}; see {log_path}")
    lines = [line for line in run.stdout.splitlines() if line.startswith(RESULT_MARKER)]
    if not lines:
        raise BenchError(f"{name} printed no {RESULT_MARKER.strip()} line; see {log_path}")
    reported = json.loads(lines[-1][len(RESULT_MARKER) :])

    check = verify.Verification()
    if name == "ceiling":
        check.expect("contender.republished", reported["republished"], n)
        verify.verify_origins(service_url, n, mode="copy", lineage=False, result=check)
    else:
        expected = workload.expected_counts(n)
        check.expect("contender.republished", reported["republished"], expected.republish)
        check.expect("contender.archived", reported["archived"], expected.archive)
        verify.verify_origins(service_url, n, mode="replay", lineage=False, result=check)
        verify.verify_jsonl_archive(archive, n, check)
    verify.verify_pending(service_url, check)
    return RunResult(
        contender=name,
        n=n,
        measured_n=n,
        wall_s=run.wall_s,
        work_s=float(reported["loop_s"]),
        ok=check.ok,
        memory_mib=run.peaks.as_mib(),
        checks=check.checks,
        errors=check.errors,
        details={"reported": reported, "memory_samples": run.peaks.samples},
    )
