"""A real Airflow 3 stack on loopback for UI and event-driven tests.

API server, scheduler, DAG processor and triggerer run as separate processes (LocalExecutor, SQLite in a
private ``AIRFLOW_HOME``), exactly as ``airflow standalone`` would start them, on a free port. Every
process is started in its own session, killed if the test process dies, and stopped by PID with its
children (LocalExecutor workers, task supervisors) by :meth:`AirflowStack.stop`; the home is deleted.

Use the ``airflow_stack`` fixture (tests/conftest.py); :class:`AirflowStack` offers a small REST client
(``api``), waits (``wait_for_dag``, ``wait_for_run``) and the UI base URL for the browser.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pulsar_standalone import free_port, kill_when_parent_dies

if TYPE_CHECKING:
    from collections.abc import Callable

AIRFLOW = str(Path(sys.executable).parent / "airflow")
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")


def _descendants(pid: int) -> list[int]:
    """Child processes of ``pid``, recursively (from /proc, no extra dependency)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class AirflowApiError(RuntimeError):
    """A REST call to the stack's API server failed; the message has the status and body."""

    def __init__(self, method: str, url: str, status: int, body: str) -> None:
        shown = body if status >= 500 else body[:500]
        super().__init__(f"{method} {url} -> HTTP {status}: {shown}")
        self.status = status
        self.body = body


@dataclass
class AirflowStack:
    """A running Airflow (api-server + scheduler + dag-processor + triggerer) on 127.0.0.1."""

    home: Path
    port: int
    env: dict[str, str]
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ------------------------------------------------------------------ REST
    def api(self, method: str, path: str, body: Any = None, *, timeout: float = 30.0) -> Any:
        """Call ``/api/v2<path>`` (the all-admins auth manager needs no token); returns decoded JSON."""
        url = f"{self.base_url}/api/v2{path}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            body_text = exc.read().decode(errors="replace")
            if exc.code >= 500:  # the server's traceback is in its log, not in the response
                body_text += "\n" + self.tail_logs(lines=80, names=("api-server",))
            raise AirflowApiError(method, url, exc.code, body_text) from None
        return json.loads(raw) if raw.strip() else None

    def health(self) -> dict[str, Any]:
        return dict(self.api("GET", "/monitor/health", timeout=5))

    def wait_healthy(self, timeout_s: float = 240.0) -> None:
        """Wait until the API answers and scheduler, DAG processor and triggerer report healthy."""
        deadline = time.monotonic() + timeout_s
        last: Any = "no answer"
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                last = self.health()
                parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")
                if all((last.get(p) or {}).get("status") == "healthy" for p in parts):
                    return
            except (OSError, AirflowApiError, ValueError) as exc:
                last = str(exc)
            time.sleep(0.25)
        raise RuntimeError(f"Airflow stack not healthy after {timeout_s:.0f} s: {last}\n{self.tail_logs()}")

    def wait_for_dag(self, dag_id: str, timeout_s: float = 180.0) -> dict[str, Any]:
        """Wait until the DAG processor has parsed ``dag_id``; returns the DAG as the API shows it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._check_alive()
            with contextlib.suppress(AirflowApiError):
                return dict(self.api("GET", f"/dags/{dag_id}"))
            time.sleep(0.25)
        errors = self.api("GET", "/importErrors")
        raise RuntimeError(f"DAG {dag_id!r} not parsed within {timeout_s:.0f} s; import errors: {errors}")

    def unpause(self, dag_id: str) -> None:
        self.api("PATCH", f"/dags/{dag_id}", {"is_paused": False})

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None) -> str:
        """Trigger a run now; returns its run id."""
        from datetime import UTC, datetime

        body = {"logical_date": datetime.now(UTC).isoformat(), "conf": conf or {}}
        return str(self.api("POST", f"/dags/{dag_id}/dagRuns", body)["dag_run_id"])

    def wait_for_run(
        self, dag_id: str, run_id: str, timeout_s: float = 600.0, on_poll: Callable[[], None] | None = None
    ) -> dict[str, Any]:
        """Wait until the run is finished (success or failed); returns the run. ``on_poll`` is called
        at every poll of an unfinished run (e.g. to answer a request the run makes)."""
        deadline = time.monotonic() + timeout_s
        run: dict[str, Any] = {}
        while time.monotonic() < deadline:
            self._check_alive()
            run = dict(self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}"))
            if run.get("state") in ("success", "failed"):
                return run
            if on_poll is not None:
                on_poll()
            time.sleep(0.5)
        raise RuntimeError(f"run {dag_id}/{run_id} not finished within {timeout_s:.0f} s: {run}")

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict[str, Any]]:
        rows = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
        return {row["task_id"]: row for row in rows}

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        """The task's log as text (content lines joined)."""
        path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}?full_content=true"
        data = self.api("GET", path)
        content = data.get("content", data) if isinstance(data, dict) else data
        if isinstance(content, list):
            return "\n".join(
                str(item.get("event", item)) if isinstance(item, dict) else str(item) for item in content
            )
        return str(content)

    # ------------------------------------------------------------------ processes
    def _check_alive(self) -> None:
        dead = {name: p.returncode for name, p in self.processes.items() if p.poll() is not None}
        if dead:
            raise RuntimeError(f"Airflow components exited: {dead}\n{self.tail_logs()}")

    def tail_logs(self, lines: int = 25, names: tuple[str, ...] = ()) -> str:
        """The last ``lines`` of each component's log (of ``names`` only, when given)."""
        out = []
        for name in names or tuple(self.processes):
            path = self.home / f"{name}.log"
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {name}.log\n" + "\n".join(text))
        return "\n".join(out)

    def restart(self, name: str, *, kill: bool = False, timeout_s: float = 20.0) -> None:
        """Stop one component by PID (SIGTERM, or SIGKILL with ``kill``, with its children) and start
        it again with the same environment; e.g. ``restart("triggerer", kill=True)`` for a crash."""
        process = self.processes[name]
        pids = _descendants(process.pid)
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.processes[name] = _start_component(self, name)

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop every component and its children by PID (SIGTERM, then SIGKILL); delete the home."""
        pids: list[int] = []
        for process in self.processes.values():
            if process.poll() is None:
                pids.extend(_descendants(process.pid))
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                process.wait(timeout=10)
        for pid in pids:  # workers the components started and left behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.processes.clear()
        shutil.rmtree(self.home, ignore_errors=True)


def stack_env(
    home: Path, port: int, dags_folder: Path, extra_env: dict[str, str] | None = None
) -> dict[str, str]:
    """The environment every component of one stack shares."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIRFLOW__", "AIRFLOW_CONN_", "AIRFLOW_VAR_"))
    }
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__CORE__FERNET_KEY": "",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
            "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
            "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            # A new or changed DAG file is parsed at the next refresh (within 5 s) whatever this says;
            # re-parsing the unchanged ones every 5 s cost the DAG processor about 13 CPU-s a minute.
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "60",
            "AIRFLOW__DAG_PROCESSOR__BUNDLE_REFRESH_CHECK_INTERVAL": "5",
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra_env or {})
    return env


def _start_component(stack: AirflowStack, name: str) -> subprocess.Popen[bytes]:
    """Start one component (its log appended to ``<home>/<name>.log``)."""
    args = [AIRFLOW, name]
    if name == "api-server":
        args += ["--host", "127.0.0.1", "--port", str(stack.port), "--workers", "1"]
    with (stack.home / f"{name}.log").open("ab") as log:
        return subprocess.Popen(  # fixed argv, no shell
            args,
            env=stack.env,
            cwd=stack.home,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=kill_when_parent_dies,
        )


def start_airflow_stack(
    dags_folder: Path, *, extra_env: dict[str, str] | None = None, timeout_s: float = 240.0
) -> AirflowStack:
    """Migrate a fresh SQLite DB and start the four components on a free loopback port."""
    home = Path(tempfile.mkdtemp(prefix="dlq-airflow-stack-"))
    port = free_port()
    env = stack_env(home, port, dags_folder, extra_env)
    stack = AirflowStack(home=home, port=port, env=env)
    try:
        subprocess.run([AIRFLOW, "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
        # No `airflow pools set dlq_replay`: the provider's plugin creates the replay pool when the
        # scheduler starts (docs/dags.md), as it does for users.
        for name in COMPONENTS:
            stack.processes[name] = _start_component(stack, name)
        stack.wait_healthy(timeout_s)
    except BaseException:
        stack.stop()
        raise
    return stack
