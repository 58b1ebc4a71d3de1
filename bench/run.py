"""``python -m bench``: replay throughput of every contender on an empty DLQ and N = 10k, 100k and 1M
(``--sizes``, up to 3M and beyond).

For each size, broker (Apache Pulsar standalone, the embedded pulsar-lite) and contender: start a fresh
broker, create the subscriptions and produce the N DLQ messages (not timed), run the contender (timed,
peak RSS sampled over its process tree, a Spark standalone cluster's executors and a Spark Connect server
included), verify the end state (origin topics, archive, ledger, nothing left pending), stop the broker
and delete its data. This project's runs write their output root to a local folder or, with
``--output-root s3``, to an S3 server on loopback, and are verified from there. Prints a table, the
ratios, the scaling per step and the targets on Apache Pulsar (holds / FAILS), flags in red any
contender faster than the copy ceiling, and writes ``results.json`` and ``results.md`` into a new folder
under ``--results-dir``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import produce
from bench.brokers import BROKERS, fresh_broker
from bench.output_root import OUTPUT_ROOTS, ROOT_LABELS, output_root
from bench.pulsar_io import BenchError
from bench.results_model import CONTENDERS, OURS, RunResult, comparisons, result_from_json
from bench.table import ceiling_warnings, comparison_table, ours_steps_table, results_table

LOG = logging.getLogger("bench")
REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SIZES = "0,10k,100k,1m"
#: Messages of the untimed replay that writes the class-data archive when there is none.
WARM_UP_MESSAGES = 2_000


def parse_count(text: str) -> int:
    """``10k`` -> 10_000, ``1m`` -> 1_000_000, ``3m`` -> 3_000_000, ``2500`` -> 2_500, ``0`` -> 0."""
    match = re.fullmatch(r"\s*(\d+)\s*([kKmM]?)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(
            f"size {text!r} must be a number with an optional k or m suffix (e.g. 100k)"
        )
    return int(match.group(1)) * {"": 1, "k": 1_000, "m": 1_000_000}[match.group(2).lower()]


def parse_size(text: str) -> int:
    """A data-set size: :func:`parse_count` (0 = an empty DLQ)."""
    return parse_count(text)


def parse_sizes(text: str) -> list[int]:
    return [parse_size(part) for part in text.split(",") if part.strip()]


def parse_contenders(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in CONTENDERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown contender(s) {unknown}; choose from {', '.join(CONTENDERS)}"
        )
    return names


def parse_brokers(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in BROKERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown broker(s) {unknown}; choose from {', '.join(BROKERS)}")
    return names


def parse_ceiling(text: str) -> dict[str, Any]:
    """``workers=2,receiver_queue=2000,ack=each`` -> the ceiling's settings (validated)."""
    from bench.contenders.ceiling import CeilingSettings

    data: dict[str, Any] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"ceiling setting {part!r} must be KEY=VALUE")
        data[key.strip()] = value.strip() if key.strip() == "ack" else int(value)
    try:
        return CeilingSettings.from_json(data).to_json()
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(f"ceiling settings {text!r}: {exc}") from exc


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        allow_abbrev=False,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        default=parse_sizes(DEFAULT_SIZES),
        help=f"comma-separated DLQ sizes, a number with an optional k or m suffix, e.g. 0,100k,1m,3m "
        f"(default {DEFAULT_SIZES})",
    )
    parser.add_argument(
        "--contenders",
        type=parse_contenders,
        default=list(CONTENDERS),
        help=f"comma-separated subset of {','.join(CONTENDERS)} (default: all)",
    )
    parser.add_argument(
        "--brokers",
        type=parse_brokers,
        default=list(BROKERS),
        help=f"comma-separated subset of {','.join(BROKERS)} (default: both; every contender runs on each)",
    )
    parser.add_argument(
        "--scaling-max",
        type=parse_count,
        default=parse_count("100k"),
        help="run the local[1] and Spark standalone cluster variants of the replay only up to this size "
        "(default 100k; 0 = every size)",
    )
    parser.add_argument(
        "--connect-max",
        type=parse_count,
        default=parse_count("1m"),
        help="run the Spark Connect variant of the replay only up to this size (default 1m, where its "
        "target is; 0 = every size)",
    )
    parser.add_argument(
        "--output-root",
        choices=OUTPUT_ROOTS,
        default="local",
        help="where this project's runs write their --output-dir (run directory, archive, ledger) and are "
        "verified from: local (default, the scratch dir) or s3 (s3://dlq-bench/<run> on a fresh S3 server "
        "on loopback per run, moto, started before the clock; its keys and endpoint reach spark-submit, "
        "the cluster's workers and the Connect server through their environment). The single-process "
        "contenders keep their local JSON-lines archive",
    )
    parser.add_argument(
        "--ceiling",
        type=parse_ceiling,
        default={},
        metavar="KEY=VALUE,...",
        help="copy-ceiling settings (workers, batch, receiver_queue, max_pending, ack=each|cumulative); "
        "default: the fastest measured (bench/contenders/ceiling.py)",
    )
    parser.add_argument(
        "--handwritten-max",
        type=parse_count,
        default=parse_size("100k"),
        help="run the hand-written baseline on at most this many messages and extrapolate linearly to "
        "larger sizes, marked 'extrapolated' in the output (default 100k; 0 = never extrapolate)",
    )
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=REPO_ROOT / "bench" / "results",
        help="a new <UTC time> folder is made here for results.json, results.md and logs/ "
        "(default bench/results, git-ignored)",
    )
    parser.add_argument(
        "--scratch-dir",
        type=Path,
        default=None,
        help="where brokers and app outputs live during a run (default: the system temp dir); "
        "a few GB per million messages",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep each run's outputs (app snapshot, archive, ledger, report; JSON-lines archives) in the "
        "scratch folder; brokers are always deleted, and so is an S3 output root (moto keeps it in memory)",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=1,
        help="re-run a contender that crashed or stalled, on a fresh broker, up to this many times "
        "(default 1; recorded in the results). A wrong answer is never retried",
    )
    parser.add_argument(
        "--idle-timeout", type=float, default=120.0, help="seconds without progress = failure"
    )
    parser.add_argument(
        "--timeout", type=float, default=7200.0, help="seconds one contender may take at most"
    )
    parser.add_argument("--master", default="local[2]", help="Spark master for 'ours' (default local[2])")
    parser.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra --conf for spark-submit of 'ours' (repeatable)",
    )
    parser.add_argument(
        "--app-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for the replay app, e.g. --app-arg=--parallelism=4 (repeatable)",
    )
    parser.add_argument(
        "--class-data-archive",
        choices=("on", "off"),
        default="on",
        help="start the replay's driver JVM from the operator's managed class-data archive (default on, "
        "as the operator does; a missing archive is written by an untimed warm-up replay of "
        f"{WARM_UP_MESSAGES} messages first, as on any machine after its first replay)",
    )
    parser.add_argument(
        "--compiled-pyspark",
        choices=("on", "off"),
        default="on",
        help="import PySpark in the replay's Python driver and workers from the operator's compiled copy "
        "(default on, as the operator does for local masters; made before the first timed run); see "
        "airflow_provider_dlq/compiled_pyspark.py",
    )
    parser.add_argument(
        "--quick-jit",
        choices=("auto", "on", "off"),
        default="auto",
        help="run the replay's driver JVM with the C1-only JIT (-XX:TieredStopAtLevel=1): auto (default, "
        "as the operator does) for local masters up to 100k messages; see "
        "airflow_provider_dlq/driver_footprint.py",
    )
    parser.add_argument(
        "--render",
        type=Path,
        metavar="RESULTS_JSON",
        help="run nothing: recompute the comparisons of an earlier results.json, rewrite its results.md "
        "and print it",
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser


def run_one(
    contender: str,
    n: int,
    broker_kind: str,
    args: argparse.Namespace,
    out_dir: Path,
    scratch: Path,
    *,
    attempt: int = 1,
) -> RunResult:
    """Fresh broker, produce ``n`` (untimed), run ``contender``, verify."""
    measured = n
    if contender == "handwritten" and args.handwritten_max and n > args.handwritten_max:
        measured = args.handwritten_max
    workdir = Path(tempfile.mkdtemp(prefix=f"{contender}-{n}-", dir=scratch))
    suffix = "" if attempt == 1 else f"-attempt{attempt}"
    log_path = out_dir / "logs" / f"{broker_kind}-{n}-{contender}{suffix}.log"
    tag = f"[{broker_kind} {contender} n={n}]"
    try:
        with contextlib.ExitStack() as stack:
            broker = stack.enter_context(fresh_broker(broker_kind, scratch))
            LOG.info(
                "%s broker up in %.1f s; producing %d DLQ messages (not timed)", tag, broker.start_s, measured
            )
            produced = produce.prepare_and_produce(broker.service_url, measured)
            load_before = _load()
            LOG.info("%s produced in %.1f s; running (load average %s)", tag, produced.seconds, load_before)
            if contender in OURS:
                from bench.masters import Where, spark_target
                from bench.ours import run_ours

                run_name = f"{broker_kind}-{n}-{contender}{suffix}"
                output = stack.enter_context(output_root(args.output_root, workdir, run_name))
                where = Where(
                    master=str(args.master),
                    env=output.env,
                    log_dir=out_dir / "logs" / f"{run_name}-spark",
                    workdir=workdir,
                )
                target = stack.enter_context(spark_target(contender, where))
                result = run_ours(
                    service_url=broker.service_url,
                    admin_url=broker.admin_url,
                    n=measured,
                    workdir=workdir,
                    log_path=log_path,
                    master=target.master,
                    contender=contender,
                    adopted_parents=target.adopted_parents,
                    adopted_roots=target.adopted_roots,
                    output=output,
                    class_data_archive=args.class_data_archive == "on",
                    compiled_pyspark=args.compiled_pyspark == "on",
                    quick_jit={"on": True, "off": False}.get(args.quick_jit, "auto"),
                    spark_conf=args.spark_conf,
                    app_args=args.app_arg,
                    timeout_s=args.timeout,
                )
                result.details.update(target.details)
            else:
                from bench.single_process import run_single_process

                result = run_single_process(
                    contender,
                    service_url=broker.service_url,
                    n=measured,
                    workdir=workdir,
                    log_path=log_path,
                    idle_timeout_s=args.idle_timeout,
                    timeout_s=args.timeout,
                    settings=args.ceiling if contender == "ceiling" else None,
                )
            result.produce_s = produced.seconds
            result.broker = broker_kind
            result.details["load_average_before"] = load_before
            result.details["load_average_after"] = _load()
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    if measured != n:
        scale = n / measured
        result.details["measured_wall_s"] = result.wall_s
        result.details["measured_work_s"] = result.work_s
        result.n, result.measured_n, result.extrapolated = n, measured, True
        result.wall_s *= scale
        result.work_s *= scale
    return result


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"


def runs_at(contender: str, n: int, args: argparse.Namespace) -> bool:
    """Whether ``contender`` runs at size ``n``: the local[1] and cluster variants up to
    ``--scaling-max``, the Spark Connect variant up to ``--connect-max`` (0: every size)."""
    limit = {
        "ours_local1": args.scaling_max,
        "ours_cluster": args.scaling_max,
        "ours_connect": args.connect_max,
    }.get(contender, 0)
    return not limit or n <= limit


def run_with_retries(
    contender: str, n: int, broker_kind: str, args: argparse.Namespace, out_dir: Path, scratch: Path
) -> RunResult:
    """:func:`run_one`, again on a fresh broker when the contender crashed or stalled (up to
    ``--retries`` times). A run that finished but failed verification is a wrong answer: never retried.
    Earlier attempts' errors are kept in ``details.failed_attempts``."""
    failed: list[str] = []
    for attempt in range(1, args.retries + 2):
        try:
            result = run_one(contender, n, broker_kind, args, out_dir, scratch, attempt=attempt)
        except BenchError as exc:
            LOG.error("[%s %s n=%d] attempt %d failed: %s", broker_kind, contender, n, attempt, exc)
            failed.append(str(exc))
            continue
        if failed:
            result.details["failed_attempts"] = failed
        return result
    return RunResult(contender, n, n, 0.0, 0.0, ok=False, broker=broker_kind, errors=failed)


def warm_up(args: argparse.Namespace, out_dir: Path, scratch: Path) -> dict[str, Any]:
    """Write the replay's class-data archive with an untimed replay when a run of this project will
    use it and there is none yet (the first replay on a machine writes it, as with the operator)."""
    from airflow_provider_dlq.class_data import ClassDataArchive
    from bench.ours import spark_env

    if args.class_data_archive == "off" or not any(c in OURS for c in args.contenders):
        return {"used": False}
    plan = ClassDataArchive().plan(spark_env())
    if plan is None:
        return {"used": False, "reason": "no java or no writable cache folder"}
    if plan.writing is None:
        return {"used": True, "path": str(plan.path), "warm_up_s": None}
    # Nothing was written for this plan: the warm-up run makes (and installs) its own.
    LOG.info("writing the class-data archive with an untimed %d-message replay", WARM_UP_MESSAGES)
    started = time.perf_counter()
    result = run_with_retries("ours", WARM_UP_MESSAGES, args.brokers[0], args, out_dir, scratch)
    seconds = round(time.perf_counter() - started, 1)
    written = result.details.get("class_data_archive") == "written"
    state = "written" if written else "NOT written"
    LOG.info("class-data archive %s in %.1f s (%s)", state, seconds, plan.path)
    return {"used": written, "path": str(plan.path), "warm_up_s": seconds, "warm_up_wall_s": result.wall_s}


def machine_info() -> dict[str, Any]:
    import psutil

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "load_average_at_start": load,
    }


def stop_cleanly_on_sigterm() -> None:
    """SIGTERM ends the harness through its ``finally`` blocks: brokers and clusters stopped by PID,
    scratch data deleted (the default action would leave them to die with their parent)."""
    import signal

    def _exit(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    stop_cleanly_on_sigterm()
    if args.render is not None:
        return render(args.render)
    logging.basicConfig(
        level=logging.INFO if not args.verbose else logging.DEBUG,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("bench.pulsar").setLevel(logging.WARNING)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out_dir = args.results_dir / stamp
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    scratch_root = args.scratch_dir or Path(tempfile.gettempdir())
    scratch_root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="dlq-bench-", dir=scratch_root))
    command = "python -m bench " + " ".join(argv if argv is not None else sys.argv[1:])
    info = {
        "command": command.strip(),
        "started_at": stamp,
        "machine": machine_info(),
        "output_root": args.output_root,
    }
    LOG.info("results go to %s", out_dir)

    results: list[RunResult] = []
    failures: list[str] = []
    try:
        info["class_data_archive"] = warm_up(args, out_dir, scratch)
        for n in args.sizes:
            for broker_kind in args.brokers:
                for contender in args.contenders:
                    if not runs_at(contender, n, args):
                        continue
                    started = time.perf_counter()
                    result = run_with_retries(contender, n, broker_kind, args, out_dir, scratch)
                    if not result.ok:
                        failures.append(f"{broker_kind} {contender} n={n}: {'; '.join(result.errors)}")
                    results.append(result)
                    LOG.info(
                        "[%s %s n=%d] %s: wall %.2f s, %.0f msgs/s (%.1f s with produce and verify; load %s)",
                        broker_kind,
                        contender,
                        n,
                        "verified" if result.ok else "FAILED",
                        result.wall_s,
                        result.msgs_per_s,
                        time.perf_counter() - started,
                        _load(),
                    )
                    _write(out_dir, info, results)
    finally:
        if args.keep:
            LOG.info("run outputs kept in %s", scratch)
        else:
            shutil.rmtree(scratch, ignore_errors=True)

    text = _write(out_dir, info, results)
    print(text)
    for line in ceiling_warnings(
        comparisons(results), color=sys.stdout.isatty() or bool(os.environ.get("FORCE_COLOR"))
    ):
        print(line)
    print(f"\nresults: {out_dir / 'results.json'}")
    wrong = [r for r in results if not r.ok]
    if wrong:
        print("\nFAILED: " + "; ".join(failures or [f"{r.contender} n={r.n}: {r.errors}" for r in wrong]))
        return 1
    return 0


def render(path: Path) -> int:
    """Re-render the tables of an earlier run from its ``results.json``."""
    try:
        data = json.loads(path.read_text())
        info = {k: data[k] for k in ("command", "started_at", "machine")}
        info["class_data_archive"] = data.get("class_data_archive")
        info["output_root"] = data.get("output_root", "local")
        results = [result_from_json(r) for r in data["results"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"error: cannot read {path} as a benchmark results.json: {exc}", file=sys.stderr)
        return 2
    print(_write(path.parent, info, results))
    return 0


def archive_line(archive: dict[str, Any] | None) -> str:
    """How this project's driver JVM started: with the managed class-data archive or without."""
    if not archive or not archive.get("used"):
        reason = (archive or {}).get("reason", "off")
        return f"Class-data archive: not used ({reason}); this project's runs start a cold JVM."
    warm = archive.get("warm_up_s")
    how = "it existed already" if warm is None else f"written by an untimed warm-up replay in {warm} s"
    return f"Class-data archive: used by this project's runs ({how}), as the operator does after a first run."


def output_root_line(kind: str) -> str:
    """Where this project's runs wrote their output root."""
    where = {
        "local": "a local folder (the scratch dir)",
        "s3": "s3://dlq-bench/<run> on an S3 server on loopback (moto, fresh per run, not timed)",
    }.get(kind, kind)
    return (
        f"Output root ({ROOT_LABELS.get(kind, kind)}): this project's runs wrote their run directory, "
        f"archive and ledger to {where} and were verified from there."
    )


def _write(out_dir: Path, info: dict[str, Any], results: list[RunResult]) -> str:
    comp = comparisons(results)
    payload = {**info, "results": [r.to_json() for r in results], "comparisons": comp}
    (out_dir / "results.json").write_text(json.dumps(payload, indent=2) + "\n")
    parts = [
        f"# Benchmark {info['started_at']}",
        f"`{info['command']}` on {info['machine']['cpus']} CPUs, load at start "
        f"{info['machine']['load_average_at_start']}",
        "",
        archive_line(info.get("class_data_archive")),
        output_root_line(info.get("output_root", "local")),
        "",
        results_table(results),
        "",
        comparison_table(comp),
    ]
    warnings = ceiling_warnings(comp, color=False)
    if warnings:
        parts += ["", *warnings]
    steps = ours_steps_table(results)
    if steps:
        parts += ["", "Replay app steps (seconds):", "", steps]
    text = "\n".join(parts) + "\n"
    (out_dir / "results.md").write_text(text)
    return text


if __name__ == "__main__":
    from bench.exit import hard_exit

    hard_exit(main())
