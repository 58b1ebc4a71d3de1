"""Render benchmark results as a Markdown table (printed and written next to the JSON)."""

from __future__ import annotations

from typing import Any

from bench.results_model import LABELS, RunResult
from bench.results_model import size_label as _n


def _num(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def results_table(results: list[RunResult]) -> str:
    header = (
        "| N | contender | wall s | msgs/s | no start-up s | msgs/s (no start-up) | peak RSS MiB "
        "(driver / py workers / tree) | verified |"
    )
    lines = [header, "|" + "---|" * 8]
    for r in results:
        mem = r.memory_mib
        memory = f"{_num(mem.get('driver_mib'), 0)} / {_num(mem.get('py_workers_mib'), 0)} / " + _num(
            mem.get("tree_mib"), 0
        )
        note = f" (extrapolated from {_n(r.measured_n)})" if r.extrapolated else ""
        retried = len(r.details.get("failed_attempts", []))
        if retried:
            note += f" (passed after {retried} crashed/stalled attempt{'s' if retried > 1 else ''})"
        lines.append(
            f"| {_n(r.n)} | {LABELS.get(r.contender, r.contender)}{note} | {_num(r.wall_s, 2)} | "
            f"{_num(r.msgs_per_s, 0)} | {_num(r.work_s, 2)} | {_num(r.work_msgs_per_s, 0)} | {memory} | "
            f"{'yes' if r.ok else 'NO: ' + '; '.join(r.errors)[:200]} |"
        )
    return "\n".join(lines)


def comparison_table(comparisons: dict[str, Any]) -> str:
    lines = ["| N | ratio (throughput) | value |", "|---|---|---|"]
    for n, ratios in comparisons.get("ratios", {}).items():
        flag = "" if ratios.get("verified", True) else " (a run failed verification)"
        for name, value in ratios.items():
            if name != "verified":
                lines.append(f"| {_n(int(n))} | {name}{flag} | {_num(value, 2)} |")
    targets = comparisons.get("targets", [])
    if targets:
        lines += ["", "| target | N | value | want | met |", "|---|---|---|---|---|"]
        for t in targets:
            met = {True: "yes", False: "NO", None: "n/a"}[t["met"]]
            if t.get("note"):
                met += f" ({t['note']})"
            lines.append(f"| {t['target']} | {_n(t['n'])} | {_num(t['value'], 2)} | {t['want']} | {met} |")
    return "\n".join(lines)


def ours_steps_table(results: list[RunResult]) -> str:
    """Per-step seconds of the replay app, one column per size."""
    ours = [r for r in results if r.contender == "ours" and r.details.get("timings")]
    if not ours:
        return ""
    steps: list[str] = []
    for r in ours:
        for step in r.details["timings"]:
            if step not in steps:
                steps.append(step)
    lines = ["| step | " + " | ".join(_n(r.n) for r in ours) + " |", "|---|" + "---|" * len(ours)]
    for step in steps:
        cells = [_num(r.details["timings"].get(step), 2) for r in ours]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    lines.append(
        "| (start-up and shut-down) | " + " | ".join(_num(r.wall_s - r.work_s, 2) for r in ours) + " |"
    )
    return "\n".join(lines)
