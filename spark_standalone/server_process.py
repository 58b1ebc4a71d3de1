"""What the loopback servers of this package share: process, log and temp dir, stopped by PID."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Self

from spark_standalone.cluster import _stop_tree

if TYPE_CHECKING:
    import subprocess
    from pathlib import Path


@dataclass
class ServerProcess:
    """A server started by this process; :meth:`stop` ends it (SIGTERM, then SIGKILL, children included)
    and deletes its temp dir."""

    root: Path | None = None
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    def stop(self) -> None:
        """Stop the server by PID and delete its temp dir. Idempotent."""
        if self.process is not None:
            _stop_tree(self.process)
            self.process = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def tail(self, lines: int = 40) -> str:
        """The last lines of the server's log (for assertion messages)."""
        try:
            assert self.log_path is not None
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except (AssertionError, OSError):
            return "(no log)"
