"""Errors of the Pulsar I/O layer: configuration and runtime errors under the app's one root."""

from __future__ import annotations

from spark_apps.dlq_replay.errors import ReplayConfigError, ReplayError


class PulsarIOError(ReplayError, RuntimeError):
    """Base class of every error raised by ``spark_apps.dlq_replay.pulsar_io`` (a :class:`ReplayError`)."""


class PulsarConfigError(PulsarIOError, ReplayConfigError):
    """An option or argument is missing or invalid (exit 2 in the app); the message names it and the fix."""


class WindowError(PulsarIOError):
    """A frozen window could not be taken or does not match the topics being read."""


class RepublishError(PulsarIOError):
    """A republish batch could not be set up (bad input rows, producer creation failed)."""
