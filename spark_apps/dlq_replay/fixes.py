"""Fixes: plain Python functions that turn a failed record into a fixed payload and properties; their
contract is ``docs/playbook.md`` (Fixes), which :func:`run_fix` enforces."""

from __future__ import annotations

import functools
import importlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from operator import attrgetter
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from spark_apps.dlq_replay.errors import FixLoadError

if TYPE_CHECKING:
    from datetime import datetime

MAX_ERROR_CHARS = 2000
#: Largest payload a fix may return: Apache Pulsar's default ``maxMessageSize`` (5 MiB, metadata
#: included), so a fixed message that the broker would refuse fails in the decide step instead.
MAX_FIX_PAYLOAD_BYTES = 5 * 1024 * 1024 - 16 * 1024


class MalformedRecord(ValueError):
    """Raise from a fix when the record cannot be understood (e.g. not the JSON the fix expects)."""


class FixTimeoutError(TimeoutError):
    """A fix call ran longer than its rule's ``fix_timeout_seconds``."""


class FixExit(BaseException):
    """A fix called ``os._exit`` or ``os.abort`` (not an ``Exception``: a fix's ``except`` misses it)."""


class WorkerInterrupt(KeyboardInterrupt):
    """A SIGINT the Python worker received while a fix ran: the task stops, as it would without a fix."""


class RecordSource(Protocol):
    """Where a :class:`FixRecord` made by :meth:`FixRecord.lazy` finds row ``i``'s other fields."""

    def field(self, name: str, i: int) -> Any: ...  # row i's ``key``, ``properties``, ``context``...


def _field(name: str, doc: str) -> Any:
    """A read-only :class:`FixRecord` attribute, looked up in a lazy record's source on first use."""

    def get(self: FixRecord) -> Any:
        values = self._values
        if name not in values:
            values[name] = self._source.field(name, self._index)  # type: ignore[union-attr]
        return values[name]

    return property(get, doc=doc)


class FixRecord:
    """One DLQ message as a fix sees it (read-only); one made by :meth:`lazy` looks up everything but the
    payload on first use (most fixes read the payload alone)."""

    __slots__ = ("_index", "_payload", "_source", "_values")

    def __init__(
        self,
        payload: bytes,
        key: str | None = None,
        ordering_key: str | None = None,
        properties: dict[str, str] | None = None,
        event_time: datetime | None = None,
        context: dict[str, Any] | None = None,
        signature: str = "",
        dlq_topic: str = "",
        dlq_message_id: str = "",
    ) -> None:
        self._payload = payload
        self._source: RecordSource | None = None
        self._index = -1
        self._values: dict[str, Any] = {
            "key": key,
            "ordering_key": ordering_key,
            "properties": properties or {},
            "event_time": event_time,
            "context": context or {},
            "signature": signature,
            "dlq_topic": dlq_topic,
            "dlq_message_id": dlq_message_id,
        }

    @classmethod
    def lazy(cls, source: RecordSource, index: int, payload: bytes) -> FixRecord:
        """A record of ``source``'s row ``index``."""
        record = cls.__new__(cls)
        record._payload, record._source, record._index, record._values = payload, source, index, {}
        return record

    payload = property(attrgetter("_payload"), doc="The message payload (bytes).")
    key = _field("key", "The message key, or ``None``.")
    ordering_key = _field("ordering_key", "The ordering key, or ``None``.")
    properties = _field("properties", "The message's properties (a copy of its own for each record).")
    event_time = _field("event_time", "The event time, or ``None``.")
    context = _field("context", "The error context (``pulsar_dlq_consumer.context.CONTEXT_FIELDS``).")
    signature = _field("signature", "The error signature of the message's group.")
    dlq_topic = _field("dlq_topic", "The DLQ topic the message was read from.")
    dlq_message_id = _field("dlq_message_id", "Its message id in that topic.")

    def __repr__(self) -> str:  # never the payload: records may reach logs
        where = f"dlq_topic={self.dlq_topic!r}, dlq_message_id={self.dlq_message_id!r}"
        return f"FixRecord({where}, signature={self.signature!r})"

    def json(self) -> Any:
        """The payload parsed as UTF-8 JSON; raises :class:`MalformedRecord` if it is not."""
        try:
            return json.loads(self.payload.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise MalformedRecord(f"payload is not UTF-8 JSON: {exc}") from exc


class FixResult(NamedTuple):
    """What a fix returns: the new payload and, optionally, the new properties (``None`` = unchanged)."""

    payload: bytes | str
    properties: Mapping[str, str] | None = None


class FixOutcome(NamedTuple):
    """A fix's result for one record (``properties`` ``None``: the record's own); a tuple, one per record."""

    ok: bool
    payload: bytes | None = None
    properties: dict[str, str] | None = None
    malformed: bool = False
    error_class: str | None = None
    error_message: str | None = None
    #: The fix tried to end the process or raised ``KeyboardInterrupt``: a broken fix, not a bad record,
    #: so the record is ``fix_failed`` (left pending) whatever the rule's ``on_fix_error`` says.
    aborted: bool = False

    @property
    def error(self) -> str:
        return f"{self.error_class}: {self.error_message}" if self.error_class else ""


FixFunction = Callable[..., Any]
_MALFORMED_ERRORS = (MalformedRecord, UnicodeDecodeError, json.JSONDecodeError)


def batch_fix(function: FixFunction) -> FixFunction:
    """Mark ``function`` as vectorised: it takes ``list[FixRecord]`` and returns a list of results."""
    function.__dlq_batch_fix__ = True  # type: ignore[attr-defined]
    return function


@functools.cache
def load_fix(ref: str) -> FixFunction:
    """Import ``module:function`` once per process; raises :class:`FixLoadError` naming the fix."""
    module_name, _, function_name = ref.partition(":")
    try:
        with _FixGuard():
            module = importlib.import_module(module_name)
    except Exception as exc:
        raise FixLoadError(
            f"cannot import module {module_name!r} for fix {ref!r}: {type(exc).__name__}: {exc}; ship the "
            "module to Spark (list its file under `fix_files:` in the playbook, or add it to --py-files)"
        ) from exc
    except (SystemExit, FixExit) as exc:
        raise FixLoadError(
            f"importing module {module_name!r} for fix {ref!r} called {_exit_call(exc)}; a fix module must "
            "not exit when imported"
        ) from exc
    function = getattr(module, function_name, None)
    if not callable(function):
        raise FixLoadError(f"fix {ref!r}: module {module_name!r} has no function {function_name!r}")
    return function


def _error_outcome(error: BaseException) -> FixOutcome:
    cls = type(error)
    module = "" if cls.__module__ in ("builtins", "__main__") else f"{cls.__module__}."
    try:
        message = str(error)
    except Exception:
        message = f"<unprintable {cls.__name__}>"
    return FixOutcome(
        ok=False,
        malformed=isinstance(error, _MALFORMED_ERRORS),
        error_class=module + cls.__qualname__,
        error_message=message[:MAX_ERROR_CHARS],
    )


def _as_bytes(payload: Any) -> bytes:
    if isinstance(payload, (bytes, bytearray, memoryview)):
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


def _as_properties(properties: Any) -> dict[str, str] | None:
    if properties is None:
        return None
    if not isinstance(properties, Mapping):
        raise TypeError(f"fix properties must be a mapping of str to str; got {type(properties).__name__}")
    for key, value in properties.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"fix properties must map str to str; got {key!r}: {type(value).__name__}")
    return dict(properties)


def to_outcome(result: Any) -> FixOutcome:
    """Convert what a fix returned (or raised) into a :class:`FixOutcome`."""
    if type(result) is bytes and len(result) <= MAX_FIX_PAYLOAD_BYTES:  # the common case, checked first
        return FixOutcome(True, result)
    if isinstance(result, BaseException):
        return _error_outcome(result)
    payload, properties = result if isinstance(result, tuple) and len(result) == 2 else (result, None)
    try:  # a FixResult is a (payload, properties) tuple
        return FixOutcome(True, _as_bytes(payload), _as_properties(properties))
    except (TypeError, ValueError) as exc:
        return _error_outcome(exc)


def _aborted_outcome(error: BaseException) -> FixOutcome:
    """The outcome of a fix that raised a non-``Exception`` (re-raising a real SIGINT to stop the task)."""
    if isinstance(error, WorkerInterrupt):
        raise error
    outcome = _error_outcome(error)
    if isinstance(error, FixExit):
        message = f"the fix called {_exit_call(error)}, which would end the Spark Python worker"
    elif isinstance(error, SystemExit):
        message = f"the fix called {_exit_call(error)}"
    else:
        detail = f" ({outcome.error_message[:200]})" if outcome.error_message else ""
        message = f"the fix raised {outcome.error_class}{detail}"
    return outcome._replace(
        error_message=f"{message}; a fix must return a result or raise an Exception", aborted=True
    )


def _exit_call(error: SystemExit | FixExit) -> str:
    """The call that raised ``error``: ``os._exit(3)``, ``os.abort()``, ``sys.exit(3)``."""
    if isinstance(error, FixExit):
        return str(error)
    return f"sys.exit({'' if error.code is None else repr(error.code)[:200]})"


class _FixGuard:
    """While fixes run (what is contained: ``docs/playbook.md``), ``os._exit`` and ``os.abort`` raise
    :class:`FixExit`, a SIGINT :class:`WorkerInterrupt` and a call (from :meth:`arm` until ``started`` is
    reset) older than ``seconds`` :class:`FixTimeoutError` (SIGALRM: on the main thread, where Spark runs
    Python UDFs, only). The timer is set once per :func:`run_fix`, not per call (two system calls per
    record cost as much as a small fix): when it fires, the handler raises or sets it again."""

    _lock = threading.Lock()
    _depth = 0
    _real: dict[tuple[Any, str], Any] = {}
    _pid = 0
    _MODULES = tuple(m for m in (os, sys.modules.get(os.name)) if m is not None)

    def __init__(self, seconds: float | None = None) -> None:
        # Signals are handled on the main thread alone; a SIGINT that is ignored (or handled outside
        # Python) stays so, and any KeyboardInterrupt is then the fix's own.
        on_main = threading.current_thread() is threading.main_thread()
        self.previous_sigint: Any = signal.getsignal(signal.SIGINT) if on_main else None
        self.handles_sigint = self.previous_sigint not in (None, signal.SIG_IGN)
        self.seconds = seconds
        self.timed = on_main and seconds is not None and hasattr(signal, "setitimer")
        self.previous_alarm: Any = None
        self.started: float | None = None  # when the current call began (None between calls)
        self.ticking = False

    @staticmethod
    def _stand_in(name: str) -> Callable[..., None]:
        def call(*args: Any) -> None:
            if os.getpid() != _FixGuard._pid:  # a forked child: end it for real
                _FixGuard._real[(os, name)](*args)
            raise FixExit(f"os.{name}({', '.join(map(repr, args))})")

        return call

    @staticmethod
    def _interrupted(signum: int, frame: Any) -> None:
        raise WorkerInterrupt("SIGINT")

    def _expired(self, signum: int, frame: Any) -> None:
        seconds = float(self.seconds)  # type: ignore[arg-type]
        if self.started is None:
            self.ticking = False
            return
        left = self.started + seconds - time.monotonic()
        if left > 0:  # the timer outlived an earlier, shorter call: set it again
            signal.setitimer(signal.ITIMER_REAL, left)
            return
        self.ticking = False
        raise FixTimeoutError(f"the fix ran longer than fix_timeout_seconds ({seconds:g} s) and was stopped")

    def __enter__(self) -> _FixGuard:
        cls = _FixGuard
        if self.timed:
            self.previous_alarm = signal.signal(signal.SIGALRM, self._expired)
        with cls._lock:
            if cls._depth == 0:
                cls._pid = os.getpid()
                for module in cls._MODULES:
                    for name in ("_exit", "abort"):
                        cls._real[(module, name)] = getattr(module, name)
                        setattr(module, name, cls._stand_in(name))
            cls._depth += 1
        if self.handles_sigint:
            signal.signal(signal.SIGINT, self._interrupted)
        return self

    def __exit__(self, *exc: object) -> None:
        cls = _FixGuard
        if self.handles_sigint:
            signal.signal(signal.SIGINT, self.previous_sigint)
        with cls._lock:
            cls._depth -= 1
            if cls._depth == 0:
                for (module, name), real in cls._real.items():
                    setattr(module, name, real)
        if self.timed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous_alarm)
            self.started, self.ticking = None, False

    def arm(self) -> None:
        """Start the time limit of one call (``started = None`` ends it when the call returns or raises)."""
        if self.timed:
            self.started = time.monotonic()
            if not self.ticking:
                self.ticking = True
                signal.setitimer(signal.ITIMER_REAL, float(self.seconds))  # type: ignore[arg-type]


def run_fix(
    function: FixFunction, records: list[FixRecord], *, timeout_s: float | None = None
) -> list[FixOutcome]:
    """Run ``function`` over ``records``, once per record or once for a batch fix; what a call raises, or a
    call longer than ``timeout_s``, fails its records and the others go on."""
    with _FixGuard(timeout_s) as guard:
        if not getattr(function, "__dlq_batch_fix__", False):
            return [_call(function, record, guard) for record in records]
        results = _call(lambda batch: list(function(batch)), records, guard, convert=False)
        if isinstance(results, FixOutcome):  # the call raised: every record fails
            return [results] * len(records)
        if len(results) != len(records):
            error = ValueError(f"batch fix returned {len(results)} results for {len(records)} records")
            return [_error_outcome(error)] * len(records)
        return [to_outcome(result) for result in results]


def _call(function: FixFunction, argument: Any, guard: _FixGuard, *, convert: bool = True) -> Any:
    """``function(argument)`` in ``guard``'s time limit, as an outcome (the raw result if not ``convert``)."""
    try:
        guard.arm()
        try:
            result = function(argument)
        finally:
            guard.started = None
    except Exception as exc:
        return _error_outcome(exc)
    except BaseException as exc:
        return _aborted_outcome(exc)
    return to_outcome(result) if convert else result
