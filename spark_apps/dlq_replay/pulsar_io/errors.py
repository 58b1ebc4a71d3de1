"""Errors of the Pulsar I/O layer: a base class, then configuration and runtime errors."""

from __future__ import annotations


class PulsarIOError(RuntimeError):
    """Base class of every error raised by ``spark_apps.dlq_replay.pulsar_io``."""


class PulsarConfigError(PulsarIOError, ValueError):
    """An option or argument is missing or invalid; the message names it and the fix."""


class WindowError(PulsarIOError):
    """A frozen window could not be taken or does not match the topics being read."""


class PublishError(PulsarIOError):
    """A republish batch could not be set up (bad input rows, producer creation failed)."""
