"""Peak resident memory of a process tree, sampled with psutil while it runs.

Each process is put in a role: ``jvm`` (the JVM of the submitted process's own tree: spark-submit's
driver JVM, which on ``local[n]`` also hosts the executors), ``py_driver`` (the Python driver of a PySpark
app, or a single-process contender and its worker processes), ``py_workers`` (``pyspark.daemon`` and its
forked workers, summed per sample), ``remote_jvm`` (the JVMs of processes the run uses outside its own
tree: a Spark standalone cluster's executors, a Spark Connect server) and ``other`` (shell wrappers). The
peak of each role, summed over its processes in one sample, and of the whole tree is kept; for a PySpark
app ``py_driver`` is exactly one process, the driver, so its peak is the driver's own. A child of a JVM
that is still the JVM's copy (same command line: forked by ``ProcessBuilder`` and not yet turned into
``chmod``, ``rm`` or ``python`` by ``exec``) shares the JVM's memory and shows its whole RSS; it is not
counted again (see :func:`is_unexeced_jvm_child`). :func:`run_sampled` runs a contender's process under a
sampler; ``adopted_parents`` adds the children of other processes (a Spark standalone cluster's
executors, children of its workers) to the tree, ``adopted_roots`` other processes with all their
children (a Spark Connect server: its JVM and its Python workers).
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from typing import IO, TYPE_CHECKING, TypeVar

import psutil

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

T = TypeVar("T")
ROLES = ("jvm", "py_driver", "py_workers", "remote_jvm", "other")
JVM_ROLES = ("jvm", "remote_jvm")


def role_of(name: str, cmdline: list[str], *, adopted: bool = False) -> str:
    """Classify one process by its name and command line; ``adopted``: it is not in the submitted
    process's own tree but a cluster's executor or a Connect server (or one of their children), where a
    JVM is ``remote_jvm`` and any Python process works for the run's tasks (``py_workers``)."""
    joined = " ".join(cmdline)
    if name == "java" or (cmdline and cmdline[0].endswith("/java")):
        return "remote_jvm" if adopted else "jvm"
    if "pyspark.daemon" in joined or "pyspark.worker" in joined or "pyspark/daemon.py" in joined:
        return "py_workers"
    if "python" in name or (cmdline and "python" in cmdline[0].rsplit("/", 1)[-1]):
        return "py_workers" if adopted else "py_driver"
    return "other"


def is_unexeced_jvm_child(parent: tuple[str, list[str]] | None, cmdline: list[str]) -> bool:
    """Whether a process is a JVM's child between its fork and its ``exec``: it runs the JVM's command
    line and shares (or copies) the JVM's pages, so its RSS is the JVM's own. The Spark driver JVM makes
    such children for every command it runs (``chmod`` of files it writes, ``rm -rf`` of its temporary
    folders at shut-down, the Python workers' daemon); counting them doubled the JVM's peak of some runs.
    ``parent`` is the parent's role and command line, ``None`` when it is not in the sampled tree."""
    return parent is not None and parent[0] in JVM_ROLES and cmdline == parent[1]


def rss_of_one_program(proc: psutil.Process, identify: Callable[[str], T]) -> tuple[T, int] | None:
    """``(identify(name), RSS)`` of ``proc``, or ``None`` when it ran ``exec`` while being read. The name
    is read before the RSS and again after ``identify`` (which may read the command line), so all of it
    belongs to one program; it is re-read every sample, as spark-submit's shell execs into java. A child
    of the JVM read just before its ``exec`` shows the JVM's RSS; read just after, its own name and command
    line, so without this check it counted as a second JVM's worth of memory under "other"."""
    before = proc.name()
    rss = int(proc.memory_info().rss)
    identity = identify(before)
    return (identity, rss) if proc.name() == before else None


@dataclass
class MemoryPeaks:
    """Peak RSS in bytes, per role and for the whole tree; ``samples`` says how often it was seen."""

    peak: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ROLES, 0))
    tree_peak: int = 0
    samples: int = 0

    def as_mib(self) -> dict[str, float]:
        out = {f"{role}_mib": round(value / 2**20, 1) for role, value in self.peak.items()}
        out["tree_mib"] = round(self.tree_peak / 2**20, 1)
        out["driver_mib"] = round((self.peak["jvm"] + self.peak["py_driver"]) / 2**20, 1)
        return out


class TreeMemorySampler:
    """Samples the tree rooted at ``pid`` every ``interval_s`` seconds in a daemon thread."""

    def __init__(
        self,
        pid: int,
        interval_s: float = 0.1,
        adopted_parents: tuple[int, ...] = (),
        adopted_roots: tuple[int, ...] = (),
    ) -> None:
        self._root = psutil.Process(pid)
        # Long-lived processes (Spark standalone workers) whose children (executors) belong to the run.
        self._adopted = [psutil.Process(p) for p in adopted_parents]
        # Processes that belong to the run with all their children (a Spark Connect server).
        self._adopted_roots = [psutil.Process(p) for p in adopted_roots]
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-rss-sampler", daemon=True)
        self._roles: dict[tuple[int, str, bool], tuple[str, list[str]]] = {}
        self.peaks = MemoryPeaks()

    def start(self) -> TreeMemorySampler:
        self._thread.start()
        return self

    def stop(self) -> MemoryPeaks:
        self._stop.set()
        self._thread.join(timeout=5)
        return self.peaks

    def sample(self) -> None:
        """Take one sample now (also called by the thread)."""
        try:
            procs = [(proc, False) for proc in (self._root, *self._root.children(recursive=True))]
        except psutil.NoSuchProcess:
            return
        for parent in self._adopted:
            with contextlib.suppress(psutil.NoSuchProcess):
                procs += [(child, True) for child in parent.children(recursive=True)]
        for root in self._adopted_roots:
            with contextlib.suppress(psutil.NoSuchProcess):
                procs += [(proc, True) for proc in (root, *root.children(recursive=True))]
        per_role = dict.fromkeys(ROLES, 0)
        jvms: dict[int, tuple[str, list[str]]] = {}
        seen: set[int] = set()
        for proc, adopted in procs:
            if proc.pid in seen:
                continue
            seen.add(proc.pid)
            try:
                read = rss_of_one_program(proc, partial(self._role, proc, adopted=adopted))
                if read is None:
                    continue
                (role, cmdline), rss = read
                # Only a process that looks like a JVM can be a JVM's unexec'd child: ask its parent then.
                parent = jvms.get(proc.ppid()) if role in JVM_ROLES else None
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            if is_unexeced_jvm_child(parent, cmdline):
                continue
            if role in JVM_ROLES:
                jvms[proc.pid] = (role, cmdline)
            per_role[role] += rss
        for role, value in per_role.items():
            self.peaks.peak[role] = max(self.peaks.peak[role], value)
        self.peaks.tree_peak = max(self.peaks.tree_peak, sum(per_role.values()))
        self.peaks.samples += 1

    def _role(self, proc: psutil.Process, name: str, *, adopted: bool) -> tuple[str, list[str]]:
        """The role and command line of ``proc`` running ``name``, read once per pid and name."""
        key = (proc.pid, name, adopted)
        known = self._roles.get(key)
        if known is None:
            cmdline = proc.cmdline()
            known = self._roles[key] = (role_of(name, cmdline, adopted=adopted), cmdline)
        return known

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self._interval)


@dataclass
class SampledRun:
    """A finished process: its stdout, exit code, wall time and the peak memory of its tree."""

    stdout: str
    returncode: int
    wall_s: float
    peaks: MemoryPeaks


def run_sampled(
    cmd: list[str],
    log: IO[str],
    *,
    what: str,
    timeout_s: float | None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    adopted_parents: tuple[int, ...] = (),
    adopted_roots: tuple[int, ...] = (),
) -> SampledRun:
    """Run ``cmd`` (stderr to ``log``), timed from start to exit, sampling its tree's memory meanwhile.

    Raises :class:`~bench.pulsar_io.BenchError` naming ``what`` and the log when it outlives ``timeout_s``.
    """
    from bench.pulsar_io import BenchError

    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=cwd)
    sampler = TreeMemorySampler(
        proc.pid, adopted_parents=adopted_parents, adopted_roots=adopted_roots
    ).start()
    try:
        stdout, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        proc.kill()
        proc.communicate()
        raise BenchError(f"{what} did not finish within {timeout_s:.0f} s; see {log.name}") from exc
    finally:
        peaks = sampler.stop()
    return SampledRun(stdout, proc.returncode, time.perf_counter() - started, peaks)
