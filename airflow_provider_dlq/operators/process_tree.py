"""Stop a process the operator started and everything it started, by PID (``on_kill``)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import logging

    from airflow.sdk.types import Logger

#: Seconds the processes get to exit after SIGTERM before they are killed.
TERMINATE_WAIT_S = 10.0


def stop_process_tree(pid: int, log: Logger | logging.Logger, name: str) -> None:
    """SIGTERM ``pid`` and its descendants, wait up to :data:`TERMINATE_WAIT_S`, SIGKILL what is left."""
    import psutil

    try:
        parent = psutil.Process(pid)
        procs = [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:  # already exited
        return
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=TERMINATE_WAIT_S)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    log.info("Stopped %s (pid %s) and %d child processes", name, pid, len(procs) - 1)
