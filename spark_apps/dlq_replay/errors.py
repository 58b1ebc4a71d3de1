"""The replay app's error hierarchy: every error says what is wrong and how to fix it."""

from __future__ import annotations


class ReplayError(Exception):
    """Base class of every error the replay app raises on purpose."""


class ReplayConfigError(ReplayError, ValueError):
    """A command-line option or option combination is invalid."""


class PlaybookError(ReplayError, ValueError):
    """The playbook YAML is invalid; the message names the file and the line."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None) -> None:
        where = path or "<playbook>"
        if line is not None:
            where = f"{where}:{line}"
        super().__init__(f"{where}: {message}")
        self.path = path
        self.line = line


class FixLoadError(ReplayError, ValueError):
    """A fix named in the playbook cannot be imported or is not callable."""


class RunStateError(ReplayError):
    """The run directory is inconsistent with the options of this run (e.g. a reused run id)."""
