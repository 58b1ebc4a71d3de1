"""The replay app's errors, each saying what is wrong and how to fix it: :class:`ReplayConfigError` and its
subclasses exit 2, any other 1 (``docs/replay-app.md``)."""

from __future__ import annotations


class ReplayError(Exception):
    """Base class of every error the replay app raises on purpose."""


class ReplayConfigError(ReplayError, ValueError):
    """A command-line option, option combination, file or permission is invalid (exit code 2)."""


class PlaybookError(ReplayConfigError):
    """The playbook YAML is invalid; the message names the file (``path``, as shown) and the line."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None) -> None:
        where = (path or "<playbook>") + ("" if line is None else f":{line}")
        super().__init__(f"{where}: {message}")
        self.line = line


class FixLoadError(ReplayConfigError):
    """A fix named in the playbook cannot be imported or is not callable."""


class RunStateError(ReplayError):
    """The run directory is inconsistent with the options of this run (e.g. a reused run id)."""


class OptionsChangedError(RunStateError, ReplayConfigError):
    """A run id is resumed with options that differ from the ones it was started with (exit code 2)."""


class RunLockedError(ReplayError):
    """Another replay run holds the output directory lock or a subscription lease (exit code 1)."""


class LockLostError(ReplayError):
    """This run lost its lock or lease while running (another run took it over); it stops, resumable."""
