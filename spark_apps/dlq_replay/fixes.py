"""Fixes: plain Python functions that turn a failed record into a fixed payload and properties.

A fix is referenced in the playbook as ``module:function`` with a ``fix_version``. It receives a
:class:`FixRecord` and returns the new payload (``bytes`` or ``str``), a ``(payload, properties)``
tuple or a :class:`FixResult`. Raising marks the record unfixable: outcome ``fix_failed`` with the
exception class and message recorded. Raising :class:`MalformedRecord`, :class:`json.JSONDecodeError`
or :class:`UnicodeDecodeError` means the record itself is malformed: outcome ``malformed``.

Fixes run on Spark executors, once per Arrow batch: a function decorated with :func:`batch_fix`
receives the whole batch as a list and returns one result (or exception instance) per record.

A fix that runs longer than its rule's ``fix_timeout_seconds`` (per call) is interrupted and the record is
``fix_failed``; a fix that returns more than :data:`MAX_FIX_PAYLOAD_BYTES` fails the record too.
"""

from __future__ import annotations

import importlib
import json
import signal
import threading
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spark_apps.dlq_replay.errors import FixLoadError

if TYPE_CHECKING:
    from collections.abc import Iterator
    from datetime import datetime

MAX_ERROR_CHARS = 2000
#: Largest payload a fix may return: Apache Pulsar's default ``maxMessageSize`` (5 MiB, metadata
#: included), so a fixed message that the broker would refuse fails in the decide step instead.
MAX_FIX_PAYLOAD_BYTES = 5 * 1024 * 1024 - 16 * 1024


class MalformedRecord(ValueError):
    """Raise from a fix when the record cannot be understood (e.g. not the JSON the fix expects)."""


class FixTimeoutError(TimeoutError):
    """A fix call ran longer than its rule's ``fix_timeout_seconds``."""


@dataclass(frozen=True)
class FixRecord:
    """One DLQ message as a fix sees it. ``properties`` is a copy (bookkeeping keys included)."""

    payload: bytes
    key: str | None
    ordering_key: str | None
    properties: dict[str, str]
    event_time: datetime | None
    context: dict[str, Any]
    signature: str
    dlq_topic: str
    dlq_message_id: str

    def json(self) -> Any:
        """The payload parsed as UTF-8 JSON; raises :class:`MalformedRecord` if it is not."""
        try:
            return json.loads(self.payload.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise MalformedRecord(f"payload is not UTF-8 JSON: {exc}") from exc


@dataclass(frozen=True)
class FixResult:
    """What a fix returns: the new payload and, optionally, the new properties (``None`` = unchanged)."""

    payload: bytes | str
    properties: Mapping[str, str] | None = None


@dataclass(frozen=True)
class FixOutcome:
    """The result of running a fix on one record."""

    ok: bool
    payload: bytes | None = None
    properties: dict[str, str] | None = None
    malformed: bool = False
    error_class: str | None = None
    error_message: str | None = None

    @property
    def error(self) -> str:
        return f"{self.error_class}: {self.error_message}" if self.error_class else ""


FixFunction = Callable[..., Any]
_MALFORMED_ERRORS: tuple[type[BaseException], ...] = (
    MalformedRecord,
    UnicodeDecodeError,
    json.JSONDecodeError,
)
_LOADED: dict[str, FixFunction] = {}


def batch_fix(function: FixFunction) -> FixFunction:
    """Mark ``function`` as vectorised: it takes ``list[FixRecord]`` and returns a list of results."""
    function.__dlq_batch_fix__ = True  # type: ignore[attr-defined]
    return function


def is_batch_fix(function: FixFunction) -> bool:
    return bool(getattr(function, "__dlq_batch_fix__", False))


def load_fix(ref: str) -> FixFunction:
    """Import ``module:function`` (cached per process). Raises :class:`FixLoadError` with the fix."""
    found = _LOADED.get(ref)
    if found is not None:
        return found
    module_name, _, function_name = ref.partition(":")
    if not module_name or not function_name:
        raise FixLoadError(f"fix {ref!r} must be `module:function`")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise FixLoadError(
            f"cannot import module {module_name!r} for fix {ref!r}: {type(exc).__name__}: {exc}; ship the "
            "module to Spark (list its file under `fix_files:` in the playbook, or add it to --py-files)"
        ) from exc
    function = getattr(module, function_name, None)
    if not callable(function):
        raise FixLoadError(f"fix {ref!r}: module {module_name!r} has no function {function_name!r}")
    _LOADED[ref] = function
    return function


def _error_outcome(error: BaseException) -> FixOutcome:
    cls = type(error)
    name = (
        cls.__qualname__
        if cls.__module__ in ("builtins", "__main__")
        else f"{cls.__module__}.{cls.__qualname__}"
    )
    try:
        message = str(error)
    except Exception:
        message = f"<unprintable {cls.__name__}>"
    return FixOutcome(
        ok=False,
        malformed=isinstance(error, _MALFORMED_ERRORS),
        error_class=name,
        error_message=message[:MAX_ERROR_CHARS],
    )


def _as_bytes(payload: Any) -> bytes:
    if isinstance(payload, bytes):
        data = payload
    elif isinstance(payload, (bytearray, memoryview)):
        data = bytes(payload)
    elif isinstance(payload, str):
        data = payload.encode("utf-8")
    else:
        raise TypeError(
            f"a fix must return bytes, str, (payload, properties) or FixResult; got {type(payload).__name__}"
        )
    if len(data) > MAX_FIX_PAYLOAD_BYTES:
        raise ValueError(
            f"the fix returned a payload of {len(data)} bytes; a republished message may hold at most "
            f"{MAX_FIX_PAYLOAD_BYTES} (Pulsar's default maxMessageSize)"
        )
    return data


def _as_properties(properties: Any, original: dict[str, str]) -> dict[str, str]:
    if properties is None:
        return dict(original)
    if not isinstance(properties, Mapping):
        raise TypeError(f"fix properties must be a mapping of str to str; got {type(properties).__name__}")
    out: dict[str, str] = {}
    for key, value in properties.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"fix properties must map str to str; got {key!r}: {type(value).__name__}")
        out[key] = value
    return out


def to_outcome(result: Any, record: FixRecord) -> FixOutcome:
    """Convert what a fix returned (or raised) into a :class:`FixOutcome`."""
    if isinstance(result, BaseException):
        return _error_outcome(result)
    try:
        if isinstance(result, FixResult):
            return FixOutcome(
                True, _as_bytes(result.payload), _as_properties(result.properties, record.properties)
            )
        if isinstance(result, tuple) and len(result) == 2:
            return FixOutcome(True, _as_bytes(result[0]), _as_properties(result[1], record.properties))
        return FixOutcome(True, _as_bytes(result), dict(record.properties))
    except (TypeError, ValueError) as exc:
        return _error_outcome(exc)


class _TimeLimit:
    """Per-call time limit: :meth:`armed` raises :class:`FixTimeoutError` in its block after ``seconds``.

    SIGALRM, main thread only (where Spark runs Python UDFs); elsewhere, and for ``None``, no limit. The
    handler is installed once for the whole :func:`run_fix` (the ``with`` block), each call only arms
    and disarms the timer: a signal handler swap per record cost more than many fixes themselves.
    """

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.usable = (
            seconds is not None
            and hasattr(signal, "setitimer")
            and threading.current_thread() is threading.main_thread()
        )
        self.previous: Any = None

    def _expired(self, signum: int, frame: Any) -> None:
        raise FixTimeoutError(
            f"the fix ran longer than fix_timeout_seconds ({self.seconds:g} s) and was stopped"
        )

    def __enter__(self) -> _TimeLimit:
        if self.usable:
            self.previous = signal.signal(signal.SIGALRM, self._expired)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.usable:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)

    def arm(self) -> None:
        """Start the time limit of one call (:meth:`disarm` it when the call returns or raises)."""
        if self.usable:
            signal.setitimer(signal.ITIMER_REAL, float(self.seconds))  # type: ignore[arg-type]

    def disarm(self) -> None:
        if self.usable:
            signal.setitimer(signal.ITIMER_REAL, 0)

    @contextmanager
    def armed(self) -> Iterator[None]:
        self.arm()
        try:
            yield
        finally:
            self.disarm()


def run_fix(
    function: FixFunction | None, records: list[FixRecord], *, timeout_s: float | None = None
) -> list[FixOutcome]:
    """Run ``function`` over ``records`` (one call per record, or one call for a batch fix).

    ``None`` republishes the records unchanged. Exceptions become failed outcomes; ``BaseException``
    that is not an ``Exception`` (``KeyboardInterrupt``, ``SystemExit``) propagates. A call that takes
    longer than ``timeout_s`` fails with :class:`FixTimeoutError`.
    """
    if function is None:
        return [FixOutcome(True, r.payload, dict(r.properties)) for r in records]
    if is_batch_fix(function):
        try:
            with _TimeLimit(timeout_s) as limit, limit.armed():
                results = list(function(records))
        except Exception as exc:
            return [_error_outcome(exc) for _ in records]
        if len(results) != len(records):
            error = ValueError(f"batch fix returned {len(results)} results for {len(records)} records")
            return [_error_outcome(error) for _ in records]
        return [to_outcome(res, rec) for res, rec in zip(results, records, strict=True)]
    outcomes: list[FixOutcome] = []
    with _TimeLimit(timeout_s) as limit:
        for record in records:
            try:
                limit.arm()  # what limit.armed() does, without a generator per record
                try:
                    result = function(record)
                finally:
                    limit.disarm()
            except Exception as exc:
                outcomes.append(_error_outcome(exc))
                continue
            outcomes.append(to_outcome(result, record))
    return outcomes


@dataclass
class FixRegistry:
    """Loads each fix once per executor process."""

    refs: tuple[str, ...] = ()
    functions: dict[str, FixFunction] = field(default_factory=dict)

    def get(self, ref: str) -> FixFunction:
        if ref not in self.functions:
            self.functions[ref] = load_fix(ref)
        return self.functions[ref]
