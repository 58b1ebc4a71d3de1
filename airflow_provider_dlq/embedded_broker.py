"""Start and stop the embedded ``pulsar-lite`` broker (extra ``embedded``) of the demo, tests and bench."""

from __future__ import annotations

import contextlib
import logging
import socket
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_provider_dlq.errors import DlqProviderError
from airflow_provider_dlq.operators.process_tree import stop_process_tree

if TYPE_CHECKING:
    import os

log = logging.getLogger(__name__)


class EmbeddedBrokerError(DlqProviderError, RuntimeError):
    """The embedded broker could not be started or reached."""


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class EmbeddedBroker(contextlib.AbstractContextManager["EmbeddedBroker"]):
    """A running pulsar-lite broker."""

    service_url: str
    metrics_url: str
    pid: int
    data_dir: Path

    def stop(self) -> None:
        """Stop the broker by PID (SIGTERM, then SIGKILL). Safe to call twice."""
        from pulsar_lite import process_manager as pm

        with contextlib.suppress(Exception):
            pm.process_manager._processes.pop(str((self.data_dir / "data.db").absolute()), None)
        stop_process_tree(self.pid, log, "the embedded broker")

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_embedded_broker(
    data_dir: str | os.PathLike[str], *, default_partitions: int | None = None
) -> EmbeddedBroker:
    """Start a pulsar-lite broker in ``data_dir`` with a private metrics port, and wait for its metrics;
    :class:`EmbeddedBrokerError` with the fix when ``pulsar-lite`` is missing or the broker stays down."""
    try:
        from pulsar_lite import process_manager as pm
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise EmbeddedBrokerError(
            "pulsar-lite is not installed; install the extra: `pip install 'airflow-provider-dlq[embedded]'`"
        ) from exc

    directory = Path(data_dir).absolute()
    directory.mkdir(parents=True, exist_ok=True)
    metrics_port = free_port()
    lines = ['log_level = "warn"']
    if default_partitions is not None:
        lines.append(f"default_partitions = {int(default_partitions)}")
    lines += ["", "[metrics]", "enabled = true", f'addr = "127.0.0.1:{metrics_port}"', ""]
    (directory / "pulsar-lite.toml").write_text("\n".join(lines))

    handle = pm.start_broker(str(directory / "data.db"))
    process = pm.process_manager._processes[handle.db_path][0]
    broker = EmbeddedBroker(
        service_url=f"pulsar://127.0.0.1:{handle.port}",
        metrics_url=f"http://127.0.0.1:{metrics_port}/metrics",
        pid=process.pid,
        data_dir=directory,
    )
    deadline = time.monotonic() + 15
    while True:
        try:
            with urllib.request.urlopen(broker.metrics_url, timeout=1):
                return broker
        except OSError as exc:
            if time.monotonic() > deadline:
                broker.stop()
                raise EmbeddedBrokerError(
                    f"embedded broker metrics did not come up at {broker.metrics_url}: {exc}; "
                    f"check {directory / 'pulsar-lite.toml'}"
                ) from exc
            time.sleep(0.1)
