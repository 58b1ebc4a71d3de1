"""The result of one contender on one data set, and the comparisons the harness prints."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

CONTENDERS = ("ceiling", "handwritten", "tuned", "ours", "ours_local1", "ours_cluster", "ours_connect")
#: The replay app's runs: the same app on four Spark masters.
OURS = ("ours", "ours_local1", "ours_cluster", "ours_connect")
LABELS = {
    "ceiling": "copy ceiling",
    "handwritten": "hand-written baseline",
    "tuned": "tuned single process",
    "ours": "this project (Spark local[2])",
    "ours_local1": "this project (Spark local[1])",
    "ours_cluster": "this project (Spark standalone, 2 workers x 1 core)",
    "ours_connect": "this project (Spark Connect, server on local[2])",
}
#: The brokers the targets are set on (pulsar-lite runs, but is not a performance target).
TARGET_BROKERS = ("apache",)
#: The master the targets of ``ours`` are set on.
TARGET_MASTER = "local[2]"
#: Peak RSS of the whole process tree allowed at 3M (1.5 GB, read as 1.5 GiB).
TREE_RSS_LIMIT_MIB = 1536.0
#: Growth allowed from 1M to 3M messages of the µs per message and of the Python driver's peak RSS.
GROWTH_LIMIT = 1.15


@dataclass
class RunResult:
    """One contender on one data set of ``n`` DLQ messages.

    ``wall_s`` is end to end: process start (and for ``ours`` JVM and Spark session start-up) to exit.
    ``work_s`` leaves start-up out: the processing loop of a single-process contender, or the sum of
    the replay app's step timings from its ``report.json``. When ``extrapolated`` is set, the contender
    ran on ``measured_n`` messages and both times are scaled linearly to ``n``.
    """

    contender: str
    n: int
    measured_n: int
    wall_s: float
    work_s: float
    ok: bool
    #: ``apache`` (Apache Pulsar standalone) or ``lite`` (the embedded pulsar-lite).
    broker: str = "lite"
    extrapolated: bool = False
    produce_s: float = 0.0
    memory_mib: dict[str, float] = field(default_factory=dict)
    checks: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def msgs_per_s(self) -> float:
        return self.n / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def work_msgs_per_s(self) -> float:
        return self.n / self.work_s if self.work_s > 0 else 0.0

    @property
    def us_per_msg(self) -> float:
        return 1e6 * self.wall_s / self.n if self.n else 0.0

    @property
    def work_us_per_msg(self) -> float:
        """µs per message without start-up (``work_s``)."""
        return 1e6 * self.work_s / self.n if self.n else 0.0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            msgs_per_s=round(self.msgs_per_s, 1),
            work_msgs_per_s=round(self.work_msgs_per_s, 1),
            us_per_msg=round(self.us_per_msg, 2),
            work_us_per_msg=round(self.work_us_per_msg, 2),
        )
        return data


def size_label(n: int) -> str:
    """``1000000`` -> ``1M``, ``100000`` -> ``100k``, ``400`` -> ``400``."""
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1_000 and n % 1_000 == 0:
        return f"{n // 1_000}k"
    return str(n)


def _ratio(num: float, den: float) -> float | None:
    return round(num / den, 3) if num > 0 and den > 0 else None


def group_runs(results: list[RunResult]) -> dict[str, dict[int, dict[str, RunResult]]]:
    """``broker -> n -> contender -> result`` for the runs that produced a time."""
    out: dict[str, dict[int, dict[str, RunResult]]] = {}
    for r in results:
        if r.wall_s > 0:
            out.setdefault(r.broker, {}).setdefault(r.n, {})[r.contender] = r
    return out


def comparisons(results: list[RunResult]) -> dict[str, Any]:
    """Ratios per broker and size (ours / each other contender, end to end and without start-up), the
    ceiling check (no contender may be faster than the copy ceiling) and the performance targets.

    Runs that finished but failed verification still get ratios (marked ``verified: false``), so the
    cost of a wrong answer is visible, but a target is never met by a run that failed verification.
    """
    grouped = group_runs(results)
    ratios: dict[str, Any] = {}
    ceiling_beaten: list[dict[str, Any]] = []
    for broker, by_size in grouped.items():
        for n, runs in sorted(by_size.items()):
            ceiling = runs.get("ceiling")
            if ceiling is not None and n > 0:
                for name, r in runs.items():
                    if name != "ceiling" and not r.extrapolated and r.msgs_per_s > ceiling.msgs_per_s:
                        ceiling_beaten.append(
                            {
                                "broker": broker,
                                "n": n,
                                "contender": name,
                                "ratio": _ratio(r.msgs_per_s, ceiling.msgs_per_s),
                            }
                        )
            ours = runs.get("ours")
            if ours is None or n == 0:
                continue
            entry: dict[str, Any] = {}
            for other in ("ceiling", "handwritten", "tuned"):
                if other in runs:
                    entry[f"ours/{other}"] = _ratio(ours.msgs_per_s, runs[other].msgs_per_s)
                    entry[f"ours/{other} (no start-up)"] = _ratio(
                        ours.work_msgs_per_s, runs[other].work_msgs_per_s
                    )
            for variant in ("ours_local1", "ours_cluster"):
                if variant in runs:
                    entry[f"ours/{variant}"] = _ratio(ours.msgs_per_s, runs[variant].msgs_per_s)
            if "ours_connect" in runs:
                connect = runs["ours_connect"]
                entry["ours_connect/ours"] = _ratio(connect.msgs_per_s, ours.msgs_per_s)
                entry["ours_connect/ours (no start-up)"] = _ratio(
                    connect.work_msgs_per_s, ours.work_msgs_per_s
                )
            entry["verified"] = all(r.ok for r in runs.values())
            ratios[f"{broker}/{n}"] = entry
    return {
        "ratios": ratios,
        "ceiling_beaten": ceiling_beaten,
        "scaling": scaling(grouped),
        "targets": targets(grouped),
    }


def scaling(grouped: dict[str, dict[int, dict[str, RunResult]]]) -> list[dict[str, Any]]:
    """local[1] time / local[2] time, per step and end to end, wherever both ran."""
    out: list[dict[str, Any]] = []
    for broker, by_size in grouped.items():
        for n, runs in sorted(by_size.items()):
            two, one = runs.get("ours"), runs.get("ours_local1")
            if two is None or one is None or n == 0:
                continue
            steps: dict[str, float | None] = {}
            t2, t1 = two.details.get("timings", {}), one.details.get("timings", {})
            for step in t2:
                if step in t1:
                    steps[step] = _ratio(float(t1[step]), float(t2[step]))
            out.append(
                {
                    "broker": broker,
                    "n": n,
                    "end_to_end": _ratio(one.wall_s, two.wall_s),
                    "no_start_up": _ratio(one.work_s, two.work_s),
                    "steps": steps,
                }
            )
    return out


def _throughput(a: RunResult, b: RunResult) -> float | None:
    return _ratio(a.msgs_per_s, b.msgs_per_s)


def _us_growth(small: RunResult, large: RunResult) -> float | None:
    return _ratio(large.work_us_per_msg, small.work_us_per_msg)


def _driver_growth(small: RunResult, large: RunResult) -> float | None:
    return _ratio(large.memory_mib.get("py_driver_mib", 0.0), small.memory_mib.get("py_driver_mib", 0.0))


def _tree_rss(r: RunResult) -> float | None:
    rss = r.memory_mib.get("tree_mib")
    return rss if rss else None


@dataclass(frozen=True)
class Target:
    """One target: ``value`` of the runs ``needs`` (``(size, contender)`` pairs), which must satisfy
    ``holds``; printed at size ``n``."""

    name: str
    n: int
    want: str
    needs: tuple[tuple[int, str], ...]
    value: Callable[..., float | None]
    holds: Callable[[float], bool]


_1M, _3M = 1_000_000, 3_000_000
#: The targets, on Apache Pulsar: no speed lost on ``local[2]`` and on Spark Connect, and a cost
#: that grows linearly with the DLQ. µs per message leave start-up out (the app's step timings): a fixed
#: start-up would hide a cost that grows faster than the DLQ.
TARGETS = (
    Target("local[2] / tuned single process, end to end", _1M, ">= 1.0",
           ((_1M, "ours"), (_1M, "tuned")), _throughput, lambda v: v >= 1.0),
    Target("local[2] / tuned single process, end to end", 100_000, ">= 0.5",
           ((100_000, "ours"), (100_000, "tuned")), _throughput, lambda v: v >= 0.5),
    Target("Spark Connect / local[2], end to end", _1M, ">= 0.8",
           ((_1M, "ours_connect"), (_1M, "ours")), _throughput, lambda v: v >= 0.8),
    Target("local[2] µs per message without start-up, 3M / 1M", _3M, f"<= {GROWTH_LIMIT}",
           ((_1M, "ours"), (_3M, "ours")), _us_growth, lambda v: v <= GROWTH_LIMIT),
    Target("local[2] Python driver peak RSS, 3M / 1M", _3M, f"<= {GROWTH_LIMIT}",
           ((_1M, "ours"), (_3M, "ours")), _driver_growth, lambda v: v <= GROWTH_LIMIT),
    Target("local[2] peak tree RSS MiB", _3M, f"<= {TREE_RSS_LIMIT_MIB:.0f}",
           ((_3M, "ours"),), _tree_rss, lambda v: v <= TREE_RSS_LIMIT_MIB),
)  # fmt: skip


def targets(grouped: dict[str, dict[int, dict[str, RunResult]]]) -> list[dict[str, Any]]:
    """:data:`TARGETS` on each of :data:`TARGET_BROKERS` that ran, every one listed: ``value`` and
    ``met`` are ``None`` (``n/a``) when a run it needs did not run. A target is never met by a run that
    failed verification, nor by ``ours`` on another master than :data:`TARGET_MASTER` (``--master``)."""
    out: list[dict[str, Any]] = []
    for broker in TARGET_BROKERS:
        by_size = grouped.get(broker)
        if not by_size:
            continue
        for target in TARGETS:
            runs = [by_size.get(n, {}).get(contender) for n, contender in target.needs]
            present = [r for r in runs if r is not None]
            value, met, note = None, None, "not run"
            if len(present) == len(runs):
                value = target.value(*present)
                off_master = [r for r in present if r.contender == "ours" and _master(r) != TARGET_MASTER]
                note = ""
                if not all(r.ok for r in present):
                    note = "a run failed verification"
                elif off_master:
                    note = f"ours ran on {_master(off_master[0])}, not {TARGET_MASTER}"
                if value is not None:
                    met = target.holds(value) and not note
            out.append(
                {
                    "broker": broker,
                    "target": target.name,
                    "n": target.n,
                    "value": value,
                    "want": target.want,
                    "met": met,
                    "note": note,
                }
            )
    return out


def _master(r: RunResult) -> str:
    """The master a run of this project used (runs recorded before it was kept: ``local[2]``)."""
    return str(r.details.get("master", TARGET_MASTER))


def result_from_json(data: dict[str, Any]) -> RunResult:
    """Rebuild a :class:`RunResult` from its :meth:`RunResult.to_json` form."""
    names = set(RunResult.__dataclass_fields__)
    return RunResult(**{k: v for k, v in data.items() if k in names})
