"""Render benchmark results as a Markdown table (printed and written next to the JSON)."""

from __future__ import annotations

from typing import Any

from bench.results_model import LABELS, OURS, RunResult
from bench.results_model import size_label as _n


def _num(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


RED, RESET = "\033[1;31m", "\033[0m"


def _broker(name: str) -> str:
    from bench.brokers import BROKER_LABELS

    return BROKER_LABELS.get(name, name)


#: The peak RSS columns of the results table: (header, key of ``RunResult.memory_mib``).
MEMORY_COLUMNS = (
    ("Python driver", "py_driver_mib"),
    ("spark-submit JVM", "jvm_mib"),
    ("Python workers", "py_workers_mib"),
    ("cluster/Connect JVMs", "remote_jvm_mib"),
    ("tree", "tree_mib"),
)


def memory_cell(memory_mib: dict[str, float]) -> str:
    """Peak RSS MiB per role and of the tree (``n/a``: not recorded by the run)."""
    return " / ".join(_num(memory_mib.get(key), 0) for _, key in MEMORY_COLUMNS)


def results_table(results: list[RunResult]) -> str:
    header = (
        "| broker | N | contender | wall s | msgs/s | no start-up s | msgs/s (no start-up) | "
        "µs/msg (no start-up) | "
        f"peak RSS MiB ({' / '.join(name for name, _ in MEMORY_COLUMNS)}) | verified |"
    )
    lines = [header, "|" + "---|" * 10]
    for r in results:
        memory = memory_cell(r.memory_mib)
        note = f" (extrapolated from {_n(r.measured_n)})" if r.extrapolated else ""
        retried = len(r.details.get("failed_attempts", []))
        if retried:
            note += f" (passed after {retried} crashed/stalled attempt{'s' if retried > 1 else ''})"
        lines.append(
            f"| {_broker(r.broker)} | {_n(r.n)} | {LABELS.get(r.contender, r.contender)}{note} | "
            f"{_num(r.wall_s, 2)} | {_num(r.msgs_per_s, 0)} | {_num(r.work_s, 2)} | "
            f"{_num(r.work_msgs_per_s, 0)} | {_num(r.work_us_per_msg, 1)} | "
            f"{memory} | {'yes' if r.ok else 'NO: ' + '; '.join(r.errors)[:200]} |"
        )
    return "\n".join(lines)


def comparison_table(comparisons: dict[str, Any]) -> str:
    lines = ["| broker | N | ratio (throughput) | value |", "|---|---|---|---|"]
    for key, ratios in comparisons.get("ratios", {}).items():
        broker, _, n = key.partition("/")
        flag = "" if ratios.get("verified", True) else " (a run failed verification)"
        for name, value in ratios.items():
            if name != "verified":
                lines.append(f"| {_broker(broker)} | {_n(int(n))} | {name}{flag} | {_num(value, 2)} |")
    scaling = comparisons.get("scaling", [])
    if scaling:
        lines += ["", "local[1] time / local[2] time, per step:", ""]
        steps: list[str] = []
        for s in scaling:
            steps += [k for k in s["steps"] if k not in steps]
        lines.append("| broker | N | end to end | no start-up | " + " | ".join(steps) + " |")
        lines.append("|" + "---|" * (4 + len(steps)))
        for s in scaling:
            cells = [_num(s["steps"].get(k), 2) for k in steps]
            lines.append(
                f"| {_broker(s['broker'])} | {_n(s['n'])} | {_num(s['end_to_end'], 2)} | "
                f"{_num(s['no_start_up'], 2)} | " + " | ".join(cells) + " |"
            )
    targets = comparisons.get("targets", [])
    if targets:
        lines += ["", "Targets (Apache Pulsar only):", ""]
        lines += ["| broker | target | N | value | want | holds |", "|---|---|---|---|---|---|"]
        for t in targets:
            met = {True: "holds", False: "FAILS", None: "n/a"}[t["met"]]
            if t.get("note"):
                met += f" ({t['note']})"
            lines.append(
                f"| {_broker(t['broker'])} | {t['target']} | {_n(t['n'])} | {_num(t['value'], 2)} | "
                f"{t['want']} | {met} |"
            )
    return "\n".join(lines)


def ceiling_warnings(comparisons: dict[str, Any], *, color: bool) -> list[str]:
    """One line per contender that ran faster than the copy ceiling: the ceiling is then not one."""
    out = []
    for b in comparisons.get("ceiling_beaten", []):
        text = (
            f"CEILING BEATEN: {LABELS.get(b['contender'], b['contender'])} ran {b['ratio']:.2f}x the copy "
            f"ceiling on {_broker(b['broker'])} at N={_n(b['n'])}: the ceiling is not the fastest copy"
        )
        out.append(f"{RED}{text}{RESET}" if color else f"**{text}**")
    return out


def ours_steps_table(results: list[RunResult]) -> str:
    """Per-step seconds of the replay app, one column per broker, master and size."""
    ours = [r for r in results if r.contender in OURS and r.details.get("timings")]
    if not ours:
        return ""
    steps: list[str] = []
    for r in ours:
        for step in r.details["timings"]:
            if step not in steps:
                steps.append(step)
    heads = [f"{_broker(r.broker)} {_n(r.n)} {MASTERS.get(r.contender, r.contender)}" for r in ours]
    lines = ["| step | " + " | ".join(heads) + " |", "|---|" + "---|" * len(ours)]
    for step in steps:
        cells = [_num(r.details["timings"].get(step), 2) for r in ours]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    lines.append(
        "| (start-up and shut-down) | " + " | ".join(_num(r.wall_s - r.work_s, 2) for r in ours) + " |"
    )
    lines.append("| wall | " + " | ".join(_num(r.wall_s, 2) for r in ours) + " |")
    return "\n".join(lines)


MASTERS = {
    "ours": "local[2]",
    "ours_local1": "local[1]",
    "ours_cluster": "standalone x2",
    "ours_connect": "Connect local[2]",
}
