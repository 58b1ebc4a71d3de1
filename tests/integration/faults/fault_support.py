"""The fault suite's shared parts: the table of results, spark-submit runs of the bundle, and the
end-state check (lost / doubled / pending) against the broker.

Every fault test records one row per case through the session fixture ``fault_table``; each row is
merged at once into the table in ``build/reliability/fault-table.md`` (:func:`output_dir`; rows of cases
not run this session are kept). The tests never write ``docs/reliability.md``: ``python
scripts/update_reliability_doc.py`` copies the rows from the build folder into it on purpose.
``CATEGORIES`` fixes the order of the table; a new kind of fault (a broker restart, a Spark worker
killed on a standalone cluster) is a new category with its own test module recording rows the same way.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[3]
DOC = REPO / "docs" / "reliability.md"
#: Where the tests write their tables unless ``DLQ_TEST_TABLES_DIR`` names another folder.
DEFAULT_OUTPUT_DIR = REPO / "build" / "reliability"
TABLE_FILE = "fault-table.md"
START = (
    "<!-- fault-table:start: the fault suite's output (tests/integration/faults), copied here by "
    "scripts/update_reliability_doc.py; do not edit -->"
)
END = "<!-- fault-table:end -->"
HEADER = (
    "| category | case | fault | expected | result | lost | doubled | pending |\n"
    "|---|---|---|---|---|---:|---:|---:|"
)
#: Every case of the suite, in table order, by category (each category is one test module).
CASES: dict[str, tuple[str, ...]] = {
    "kill": ("plan", "snapshot", "decide", "apply", "record", "commit", "report"),
    "kill-mid-wave": ("default-waves-dedup", "small-waves-no-dedup"),
    "broker": ("snapshot", "apply", "commit"),
    "cluster": ("worker-killed-mid-apply",),
    "concurrency": ("same-output-dir", "same-subscription-other-output-dir"),
    "bad-message": (
        "non-utf8-property",
        "non-utf8-key",
        "no-known-convention",
        "huge-error-message",
        "huge-origin-topic",
        "thousands-of-properties",
        "partition-suffixed-origin",
        "foreign-tenant-origin",
        "malformed-origin",
        "conflicting-origins",
        "non-numeric-replay-count",
        "loop-guard-replay-count",
        "duplicate-copy-other-dlq",
        "empty-payload",
        "payload-not-json",
        "multi-mib-payload",
        "batched-entries",
        "fix-raises",
        "fix-hangs",
        "fix-wrong-type",
        "fix-huge-payload",
        "fix-output-too-big-for-broker",
        "fix-calls-sys-exit",
        "fix-raises-keyboard-interrupt",
        "fix-calls-os-exit",
    ),
    "bad-input": (
        "allowlist-invalid-regex",
        "allowlist-not-a-topic",
        "token-file-missing",
        "token-on-command-line",
        "trust-file-not-pem",
        "playbook-malformed-yaml",
        "playbook-huge",
        "playbook-too-many-rules",
        "playbook-is-a-directory",
        "playbook-not-utf8",
        "playbook-unknown-action",
        "fix-module-missing",
        "output-dir-under-a-file",
        "output-dir-not-creatable",
        "since-after-until",
        "signature-not-hex",
        "resume-with-changed-options",
    ),
}
CATEGORIES = tuple(CASES)
SPARK_CONF = [
    "--master", "local[2]", "--driver-memory", "1g",
    "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=4",
]  # fmt: skip


@dataclass(frozen=True)
class FaultRow:
    """One case of the fault suite and what it did."""

    category: str
    case: str
    fault: str
    expected: str
    result: str
    lost: int | str = "-"
    doubled: int | str = "-"
    pending: int | str = "-"

    def line(self) -> str:
        cells = [self.category, f"`{self.case}`", self.fault, self.expected, scrub(self.result)]
        cells += [str(self.lost), str(self.doubled), str(self.pending)]
        return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"


_TEMP_PATH = re.compile(re.escape(tempfile.gettempdir()) + r"/[^\s'\":;,)]+")
_RANDOM = re.compile(r"-[0-9a-f]{8}(?=[-/:'\s]|$)")


def scrub(text: str) -> str:
    """The text without what differs from run to run or machine to machine: temporary paths, the
    repository's location, the random part of test topic names (the table stays stable in git)."""
    text = _TEMP_PATH.sub(
        lambda m: "<tmp>/" + m.group(0).rsplit("/", 1)[-1], text.replace(str(REPO), "<repo>")
    )
    return _RANDOM.sub("-<id>", text)


def _parse_rows(text: str) -> dict[tuple[str, str], str]:
    rows: dict[tuple[str, str], str] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) >= 2 and cells[0] in CATEGORIES:
            rows[(cells[0], cells[1].strip("`"))] = line.strip()
    return rows


def output_dir() -> Path:
    """The folder the fault and matrix tests write their tables to: ``DLQ_TEST_TABLES_DIR``, else
    ``build/reliability`` in the repository (git-ignored)."""
    given = os.environ.get("DLQ_TEST_TABLES_DIR", "")
    return Path(given).resolve() if given else DEFAULT_OUTPUT_DIR


def table_file() -> Path:
    """The fault table the tests of this machine wrote (the rows of every case run so far)."""
    return output_dir() / TABLE_FILE


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path``'s lock file: the test command's two pytest processes may merge
    rows into one table at the same time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def merge_table(
    doc: Path,
    markers: tuple[str, str, str],
    lines: dict[Any, str],
    parse: Callable[[str], dict[Any, str]],
    order: Callable[[tuple[Any, str]], Any],
) -> bool:
    """Write the table ``lines`` (by their key) into the table of ``doc`` between the ``markers`` (start,
    end, header), keeping the rows of other keys, sorted by ``order``; ``parse`` reads the rows already
    there. A ``doc`` that does not exist yet is created holding the table alone. True when it changed."""
    start, end, header = markers
    existed = doc.exists()
    text = doc.read_text(encoding="utf-8") if existed else f"{start}\n{header}\n{end}\n"
    if start not in text or end not in text:
        raise AssertionError(f"{doc} lacks the table markers {start!r} ... {end!r}")
    head, rest = text.split(start, 1)
    body, tail = rest.split(end, 1)
    merged = parse(body)
    merged.update(lines)
    ordered = [line for _, line in sorted(merged.items(), key=order)]
    new = f"{head}{start}\n{header}\n" + "\n".join(ordered) + f"\n{end}{tail}"
    if existed and new == text:
        return False
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(new, encoding="utf-8")
    return True


def read_table(doc: Path, markers: tuple[str, str], parse: Callable[[str], dict[Any, str]]) -> dict[Any, str]:
    """The rows of the table between ``markers`` in ``doc``, by key; none when it has no such table."""
    if not doc.exists():
        return {}
    text = doc.read_text(encoding="utf-8")
    start, end = markers
    if start not in text or end not in text:
        return {}
    return parse(text.split(start, 1)[1].split(end, 1)[0])


def merge_lines(lines: dict[tuple[str, str], str], doc: Path) -> bool:
    """Write the fault table ``lines`` (by (category, case)) into ``doc``, in :data:`CASES` order (see
    :func:`merge_table`)."""

    def key(item: tuple[tuple[str, str], str]) -> tuple[int, int, str]:
        (category, case), _ = item
        cases = CASES[category]
        return (CATEGORIES.index(category), cases.index(case) if case in cases else len(cases), case)

    return merge_table(doc, (START, END, HEADER), lines, _parse_rows, key)


def merge_into_doc(rows: list[FaultRow], doc: Path | None = None) -> None:
    """Write ``rows`` into the fault table of ``doc`` (default: :func:`table_file`, in the build
    folder), keeping the rows of cases not run now."""
    path = doc or table_file()
    with locked(path):
        merge_lines({(row.category, row.case): row.line() for row in rows}, path)


def table_rows(doc: Path) -> dict[tuple[str, str], str]:
    """The rows of the fault table in ``doc``, by (category, case); none when ``doc`` does not exist."""
    return read_table(doc, (START, END), _parse_rows)


def doc_cases(doc: Path = DOC) -> set[tuple[str, str]]:
    """The (category, case) pairs the table in ``doc`` lists."""
    return set(table_rows(doc))


# --------------------------------------------------------------------------- DLQ messages


def dlq_properties(origin: str, cls: str, message: str, n: int, **extra: Any) -> dict[str, Any]:
    """The context properties of a DLQ message of ``origin`` (Pulsar's keys and ours): original message
    ``n`` failed with ``cls: message``."""
    return {
        "REAL_TOPIC": origin,
        "ORIGIN_MESSAGE_ID": f"7:{n}:-1:-1",
        "__dlq.errors.topic": origin,
        "__dlq.errors.reason": "term",
        "__dlq.errors.exception.class": cls,
        "__dlq.errors.exception.message": message,
        **extra,
    }


# --------------------------------------------------------------------------- spark-submit


def spark_submit() -> str:
    return str(Path(sys.executable).parent / "spark-submit")


def start(
    bundle: Any, args: list[str], workdir: Path, name: str, spark_conf: list[str] = SPARK_CONF
) -> subprocess.Popen[bytes]:
    """spark-submit of the bundle with ``--py-files``, as in production; ``spark_conf`` sets the master.

    The driver's ``java.io.tmpdir`` (and so Spark's local dirs and the unpacked native codecs) is in
    ``workdir``: a run these tests SIGKILL leaves nothing in the system temp dir."""
    jvm_tmp = workdir / f"{name}-jvm-tmp"
    jvm_tmp.mkdir(parents=True, exist_ok=True)
    tmp_conf = ["--conf", f"spark.driver.extraJavaOptions=-Djava.io.tmpdir={jvm_tmp}"]
    cmd = [spark_submit(), *spark_conf, *tmp_conf, "--py-files", str(bundle.zip_path), str(bundle.main_path)]
    cmd += args
    out = open(workdir / f"{name}.out", "wb")  # noqa: SIM115 - closed with the process
    err = open(workdir / f"{name}.err", "wb")  # noqa: SIM115
    return subprocess.Popen(cmd, cwd=workdir, stdout=out, stderr=err, start_new_session=True)


def outputs(workdir: Path, name: str) -> tuple[str, str]:
    return (workdir / f"{name}.out").read_text(), (workdir / f"{name}.err").read_text()


def app_output(workdir: Path, name: str) -> str:
    """Everything a spark-submit run printed: the app's progress and errors are in its stdout (Spark's
    ``PythonRunner`` merges the Python driver's stderr into it), Spark's own log in its stderr."""
    out, err = outputs(workdir, name)
    return out + err


def finish(proc: subprocess.Popen[bytes], workdir: Path, name: str, timeout: float = 900) -> dict[str, Any]:
    """Wait for a run that must succeed; returns its summary line."""
    code = proc.wait(timeout=timeout)
    out, err = outputs(workdir, name)
    assert code == 0, f"{name} exited {code}:\n{err[-4000:]}\n{out[-2000:]}"
    last = out.strip().splitlines()[-1]
    assert last.startswith("DLQ_REPLAY_SUMMARY ")
    return json.loads(last[len("DLQ_REPLAY_SUMMARY ") :])


def tree(proc: subprocess.Popen[bytes]) -> list[psutil.Process]:
    try:
        root = psutil.Process(proc.pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def signal_tree(procs: list[psutil.Process], sig: int) -> None:
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(sig)


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL spark-submit and every process it started (JVM, Python driver, daemon, workers)."""
    procs = tree(proc)
    signal_tree(procs, signal.SIGKILL)
    proc.wait(timeout=60)
    psutil.wait_procs(procs, timeout=60)


def state_of(out: Path, run_id: str) -> dict[str, Any]:
    try:
        return json.loads((out / "runs" / run_id / "state.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def step_status(out: Path, run_id: str, step: str) -> str | None:
    return state_of(out, run_id).get("steps", {}).get(step, {}).get("status")


def wait_for_step(
    proc: Any, out: Path, run_id: str, step: str, ready: Any = None, timeout: float = 600
) -> None:
    """Poll ``state.json`` until ``step`` runs (and ``ready(step's progress)`` holds, e.g. a wave is in
    flight); fails when the run exits first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        progress = state_of(out, run_id).get("steps", {}).get(step, {})
        if progress.get("status") == "running" and (ready is None or ready(progress)):
            break
        if proc.poll() is not None:
            raise AssertionError(f"the run exited (code {proc.returncode}) before step {step} started")
        time.sleep(0.01)
    else:
        raise AssertionError(f"timed out waiting for step {step}")


def kill_in_step(
    proc: subprocess.Popen[bytes],
    out: Path,
    run_id: str,
    step: str,
    ready: Callable[[dict[str, Any]], bool] | None = None,
    timeout: float = 600,
) -> str:
    """SIGKILL the spark-submit tree while ``step`` runs; returns the step's status at the kill.

    Polls ``state.json`` until the step is running (and ``ready(step's progress)`` holds, e.g. a wave is
    in flight), freezes the launch's process group in one call, then the rest of its tree (SIGSTOP), so
    nothing moves while the state is read again, then kills it. A status other than ``running`` means the
    step ended before the freeze (the caller fails the case: the kill did not land where it was meant to).
    """
    wait_for_step(proc, out, run_id, step, ready, timeout)
    with contextlib.suppress(ProcessLookupError):  # the launch's process group at once (start_new_session)
        os.killpg(proc.pid, signal.SIGSTOP)
    procs = tree(proc)  # and any process that left the group
    signal_tree(procs, signal.SIGSTOP)
    status = step_status(out, run_id, step) or "missing"
    signal_tree(procs, signal.SIGKILL)
    proc.wait(timeout=60)
    psutil.wait_procs(procs, timeout=60)
    return status


# --------------------------------------------------------------------------- broker checks


def drain(client: Any, topics: str | list[str], subscription: str, idle_ms: int = 1500) -> list[Any]:
    """Everything the subscription delivers (no acks), each message id once, until ``idle_ms`` idle."""
    import pulsar

    consumer = client.subscribe(
        topics if isinstance(topics, list) else [topics],
        subscription,
        consumer_type=pulsar.ConsumerType.Shared,
        initial_position=pulsar.InitialPosition.Earliest,
        consumer_name=f"drain-{os.getpid()}-{uuid.uuid4().hex[:6]}",
    )
    got: dict[str, Any] = {}
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            try:
                msg = consumer.receive(timeout_millis=idle_ms)
            except pulsar.Timeout:
                break
            got[str(msg.message_id())] = msg
    finally:
        consumer.close()
    return list(got.values())


def message_key(msg: Any) -> str | None:
    """A message's key, or its ``fault-key`` property when the key is not UTF-8."""
    try:
        return str(msg.partition_key())
    except UnicodeDecodeError:
        return msg.properties().get("fault-key")


@dataclass(frozen=True)
class EndState:
    """A run's end state against what each DLQ message should have become."""

    lost: int  # neither where its outcome puts it, nor still pending on the DLQ: gone
    misplaced: int  # not where its outcome puts it (lost ones included)
    doubled: int  # extra copies on the origin topic
    pending: int  # DLQ messages still pending on the replayer subscription
    details: dict[str, Any]
    lost_keys: frozenset[str] = frozenset()
    pending_keys: frozenset[str] = frozenset()
    copies: dict[str, int] = field(default_factory=dict)  # key -> copies on the origin topic

    def of(self, keys: list[str]) -> tuple[int, int, int]:
        """``(lost, doubled, pending)`` of the messages ``keys``."""
        return (
            sum(k in self.lost_keys for k in keys),
            sum(max(0, self.copies.get(k, 0) - 1) for k in keys),
            sum(k in self.pending_keys for k in keys),
        )


def end_state(
    client: Any,
    *,
    origin: str | list[str],
    dlqs: list[str],
    expected: dict[str, str],
    archived_keys: list[str],
    subscription: str = "dlq-replayer",
) -> EndState:
    """Count, from the broker and the archive, what happened to each DLQ message (by key).

    ``expected`` maps each message key to its outcome: ``republished`` (on the origin, not pending),
    ``archived`` or ``loop_guarded`` (in the archive, not pending), ``dropped`` or ``duplicate`` (neither
    pending nor on the origin) or a pending outcome (still pending).
    """
    on_origin: dict[str, int] = {}
    for msg in drain(client, origin, f"verify-{uuid.uuid4().hex[:8]}"):
        key = message_key(msg)
        on_origin[key] = on_origin.get(key, 0) + 1
    pending = {message_key(m) for m in drain(client, dlqs, subscription)}
    archived = set(archived_keys)
    misplaced, lost = [], []
    for key, outcome in expected.items():
        if outcome == "republished":
            ok = on_origin.get(key, 0) >= 1 and key not in pending
        elif outcome in ("archived", "loop_guarded"):
            ok = key in archived and key not in pending
        elif outcome in ("dropped", "duplicate"):
            ok = key not in pending and key not in on_origin
        else:
            ok = key in pending
        if not ok:
            misplaced.append(key)
            if key not in pending and key not in on_origin and key not in archived:
                lost.append(key)
    doubled = sum(n - 1 for n in on_origin.values() if n > 1)
    unexpected = sorted(k for k in on_origin if expected.get(k) != "republished")
    return EndState(
        lost=len(lost),
        misplaced=len(misplaced),
        doubled=doubled,
        pending=len(pending),
        details={"misplaced": misplaced[:10], "unexpected_on_origin": unexpected[:10]},
        lost_keys=frozenset(lost),
        pending_keys=frozenset(k for k in pending if k is not None),
        copies=on_origin,
    )


def check_exact_run(
    summary: dict[str, Any],
    out: Path,
    client: Any,
    origins: str | list[str],
    dlqs: list[str],
    expected: dict[str, str],
) -> EndState:
    """A finished run's exact totals, archive and ledger, and its end state on the broker: nothing lost,
    misplaced or doubled, exactly the skipped messages pending. Returns the end state."""
    totals = summary["totals"]
    n = {o: sum(v == o for v in expected.values()) for o in ("republished", "archived", "skipped")}
    assert summary["status"] == "succeeded"
    assert totals["snapshot"] == len(expected)
    assert (totals["republished"], totals["archived"], totals["skipped"]) == (
        n["republished"],
        n["archived"],
        n["skipped"],
    )
    assert totals["acked"] == n["republished"] + n["archived"]
    assert totals["left_pending"] == n["skipped"]
    archived = parquet_values(out / "archive", "key")
    assert len(archived) == len(set(archived)) == n["archived"]
    assert len(parquet_values(out / "ledger", "replay_id")) == len(expected)
    state = end_state(client, origin=origins, dlqs=dlqs, expected=expected, archived_keys=archived)
    assert state.lost == 0, state.details
    assert state.misplaced == 0, state.details
    assert state.doubled == 0, state.details  # broker deduplication drops every re-sent sequence id
    assert state.pending == n["skipped"]
    return state


def parquet_values(path: Path, column: str) -> list[Any]:
    """Every value of ``column`` in the Parquet dataset the app wrote at ``path`` (read with pyarrow, so a
    test needs no Spark session of its own to check the archive or the ledger)."""
    import pyarrow.dataset as ds

    return list(ds.dataset(str(path), format="parquet").to_table(columns=[column]).column(column).to_pylist())
