"""``python -m bench.ceiling_sweep``: which copy-ceiling settings are fastest, on each broker.

Runs the copy ceiling with each setting of :data:`VARIANTS` (fresh broker, same workload, verified like
any contender) and prints msgs/s per broker. The default of
:class:`~bench.contenders.ceiling.CeilingSettings` is the winner of this sweep (``docs/benchmarks.md``).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.brokers import BROKER_LABELS, BROKERS
from bench.run import (
    REPO_ROOT,
    build_parser,
    parse_brokers,
    parse_size,
    run_with_retries,
    stop_cleanly_on_sigterm,
)

LOG = logging.getLogger("bench.ceiling_sweep")

#: Settings compared (unset keys keep the CeilingSettings defaults).
VARIANTS: tuple[dict[str, Any], ...] = (
    {"workers": 1, "ack": "each"},
    {"workers": 1, "ack": "cumulative"},
    {"workers": 2, "ack": "each"},
    {"workers": 2, "ack": "cumulative"},
    {"workers": 4, "ack": "each"},
    {"workers": 2, "ack": "each", "receiver_queue": 2000, "batch": 2000},
)


def _sweep(
    brokers: list[str], size: int, args: argparse.Namespace, out_dir: Path, scratch: Path
) -> list[dict[str, Any]]:
    from bench.contenders.ceiling import CeilingSettings

    rows: list[dict[str, Any]] = []
    for broker in brokers:
        for variant in VARIANTS:
            args.ceiling = CeilingSettings.from_json(variant).to_json()
            result = run_with_retries("ceiling", size, broker, args, out_dir, scratch)
            row = {
                "broker": broker,
                "settings": args.ceiling,
                "ok": result.ok,
                "wall_s": round(result.wall_s, 2),
                "msgs_per_s": round(result.msgs_per_s),
                "load": result.details.get("load_average_before"),
            }
            rows.append(row)
            LOG.info("ceiling sweep: %s", row)
            (out_dir / "sweep.json").write_text(json.dumps(rows, indent=2) + "\n")
    return rows


def sweep_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| broker | workers | ack | receiver queue | batch | msgs/s | wall s | verified | load before |"]
    lines.append("|" + "---|" * 9)
    for r in rows:
        s = r["settings"]
        lines.append(
            f"| {BROKER_LABELS[r['broker']]} | {s['workers']} | {s['ack']} | {s['receiver_queue']} | "
            f"{s['batch']} | {r['msgs_per_s']:,} | {r['wall_s']} | {'yes' if r['ok'] else 'NO'} | "
            f"{r['load']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.ceiling_sweep", description=__doc__, allow_abbrev=False
    )
    parser.add_argument("--size", type=parse_size, default=parse_size("100k"))
    parser.add_argument("--brokers", type=parse_brokers, default=list(BROKERS))
    parser.add_argument("--results-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    parser.add_argument("--scratch-dir", type=Path, default=None)
    opts = parser.parse_args(argv)
    stop_cleanly_on_sigterm()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("bench.pulsar").setLevel(logging.WARNING)
    out_dir = opts.results_dir / ("ceiling-sweep-" + datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"))
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="dlq-bench-sweep-", dir=opts.scratch_dir))
    args = build_parser().parse_args(["--idle-timeout", "60"])
    try:
        rows = _sweep(opts.brokers, opts.size, args, out_dir, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(sweep_table(rows))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    from bench.exit import hard_exit

    hard_exit(main(sys.argv[1:]))
