"""Fix execution: results, errors, malformed records, batch fixes, loading."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time

import pytest

from spark_apps.dlq_replay.errors import FixLoadError
from spark_apps.dlq_replay.fixes import FixRecord, FixResult, MalformedRecord, batch_fix, load_fix, run_fix

REAL_EXIT, REAL_ABORT = os._exit, os.abort


def rec(payload: bytes = b'{"id": 1}', **props: str) -> FixRecord:
    return FixRecord(
        payload=payload,
        key="k",
        ordering_key=None,
        properties=dict(props),
        event_time=None,
        context={"error_class": "ValueError"},
        signature="s",
        dlq_topic="persistent://p/d/dlq",
        dlq_message_id="1:1:-1:-1",
    )


def test_return_types():
    # properties None: the record's own are kept (the decide step sets the lineage on them in Arrow).
    out = run_fix(lambda r: b"x", [rec(a="1")])[0]
    assert (out.ok, out.payload, out.properties) == (True, b"x", None)
    assert run_fix(lambda r: "é", [rec()])[0].payload == "é".encode()
    out = run_fix(lambda r: (b"y", {"b": "2"}), [rec(a="1")])[0]
    assert (out.payload, out.properties) == (b"y", {"b": "2"})
    out = run_fix(lambda r: FixResult("z"), [rec(a="1")])[0]
    assert (out.payload, out.properties) == (b"z", None)
    out = run_fix(lambda r: FixResult("z", {"c": "3"}), [rec(a="1")])[0]
    assert (out.payload, out.properties) == (b"z", {"c": "3"})


class _Rows:
    """A record source that counts what it was asked for."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def field(self, name: str, i: int) -> object:
        self.asked.append(f"{name} {i}")
        known = {"key": "k", "signature": "sig", "dlq_message_id": "1:2:-1:-1", "properties": {"row": str(i)}}
        return {**known, "context": {"error_class": f"E{i}"}}.get(name)


def test_a_lazy_record_looks_up_all_but_the_payload_on_first_use_only():
    rows = _Rows()
    record = FixRecord.lazy(rows, 3, b"{}")
    assert run_fix(lambda r: r.payload, [record])[0].ok
    assert rows.asked == []  # a payload-only fix never looks anything else up
    read = (record.payload, record.key, record.signature, record.dlq_message_id, record.event_time)
    assert read == (b"{}", "k", "sig", "1:2:-1:-1", None)
    assert (record.key, record.event_time) == ("k", None)  # looked up once each, None included
    assert rows.asked == ["key 3", "signature 3", "dlq_message_id 3", "event_time 3"]
    rows.asked.clear()
    mine = record.properties
    mine["added"] = "by the fix"  # a copy of its own, kept for later reads of the same record
    assert record.properties == {"row": "3", "added": "by the fix"}
    assert record.context == {"error_class": "E3"}
    assert rows.asked == ["properties 3", "context 3"]
    with pytest.raises(AttributeError):
        record.payload = b"other"  # type: ignore[misc]
    assert "{}" not in repr(record)  # never the payload
    assert "1:2:-1:-1" in repr(record)


def test_exceptions_become_fix_failed_with_class_and_message():
    def boom(r):
        raise KeyError("customer")

    out = run_fix(boom, [rec()])[0]
    assert not out.ok
    assert not out.malformed
    assert out.error == "KeyError: 'customer'"


def test_bad_return_values_fail_with_a_type_error():
    assert run_fix(lambda r: 42, [rec()])[0].error_class == "TypeError"
    assert run_fix(lambda r: (b"x", {"a": 1}), [rec()])[0].error_class == "TypeError"


@pytest.mark.parametrize(
    "fix",
    [
        lambda r: json.loads(r.payload),
        lambda r: r.payload.decode("utf-8"),
        lambda r: r.json(),
    ],
)
def test_malformed_records(fix):
    out = run_fix(fix, [rec(b"\xff{not json")])[0]
    assert not out.ok
    assert out.malformed


def test_explicit_malformed_record():
    def fix(r):
        raise MalformedRecord("no order id")

    out = run_fix(fix, [rec()])[0]
    assert out.malformed
    assert "no order id" in out.error


def _exit(record):
    sys.exit(3)


def _interrupt(record):
    raise KeyboardInterrupt("stop")


def _os_exit(record):
    os._exit(3)


def _abort(record):
    os.abort()


#: Fixes that try to end the process, and what the record's error must say.
EXITS = {
    "sys.exit": (_exit, "SystemExit: the fix called sys.exit(3); a fix must return a result or raise"),
    "KeyboardInterrupt": (_interrupt, "KeyboardInterrupt: the fix raised KeyboardInterrupt (stop); a fix"),
    "os._exit": (_os_exit, "FixExit: the fix called os._exit(3), which would end the Spark Python worker"),
    "os.abort": (_abort, "FixExit: the fix called os.abort(), which would end the Spark Python worker"),
}


@pytest.fixture(autouse=True)
def _python_sigint_handler():
    """Each test starts from Python's own SIGINT handler: a SparkContext started earlier in the process
    (another test's) installs its own, and the checks below compare with the handler a worker has."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize("how", list(EXITS))
def test_a_fix_that_exits_fails_its_own_record_and_the_others_go_on(how):
    stops, error = EXITS[how]

    def fix(record):
        return stops(record) if record.payload == b"stop" else record.payload.upper()

    out = run_fix(fix, [rec(b"a"), rec(b"stop"), rec(b"b")], timeout_s=5)
    assert [o.payload for o in out] == [b"A", None, b"B"]
    assert (out[1].ok, out[1].aborted, out[1].malformed) == (False, True, False)
    assert error in out[1].error
    assert (os._exit, os.abort) == (REAL_EXIT, REAL_ABORT)  # put back after the run
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("how", list(EXITS))
def test_a_batch_fix_that_exits_fails_every_record_of_its_batch(how):
    stops, error = EXITS[how]

    @batch_fix
    def fix(records):
        return [stops(r) for r in records]

    out = run_fix(fix, [rec(b"a"), rec(b"b")], timeout_s=5)
    assert [(o.ok, o.aborted) for o in out] == [(False, True), (False, True)]
    assert all(error in o.error for o in out)
    assert run_fix(batch_fix(lambda rs: [r.payload for r in rs]), [rec(b"c")])[0].payload == b"c"
    assert (os._exit, os.abort) == (REAL_EXIT, REAL_ABORT)


def test_a_fix_that_swallows_exceptions_cannot_swallow_its_exit():
    def fix(record):
        try:
            os._exit(1)
        except Exception:
            return b"carried on"

    assert run_fix(fix, [rec()])[0].aborted


def test_a_process_forked_by_a_fix_still_exits_for_real():
    def fix(record):
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        return str(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])).encode()

    assert run_fix(fix, [rec()])[0].payload == b"7"


def test_a_sigint_sent_to_the_worker_still_stops_the_task():
    """A real interrupt is not the fix's doing: it propagates (the task fails) and records nothing."""

    def fix(record):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
        return record.payload

    with pytest.raises(KeyboardInterrupt):
        run_fix(fix, [rec(), rec()], timeout_s=10)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert os._exit is REAL_EXIT


def test_a_fix_that_exits_is_never_archived_by_on_fix_error():
    from types import SimpleNamespace

    from spark_apps.dlq_replay import outcomes as oc
    from spark_apps.dlq_replay.decide import _fix_outcome

    rule = SimpleNamespace(name="r", fix="m:f", on_fix_error=oc.ON_FIX_ERROR_ARCHIVE)
    exited, raised = run_fix(lambda r: sys.exit(3) if r.payload == b"x" else 1 / 0, [rec(b"x"), rec()])
    assert _fix_outcome(rule, exited)[:3] == (oc.FIX_FAILED, "fix m:f failed", exited.error)
    assert _fix_outcome(rule, raised)[0] == oc.ARCHIVED


def test_batch_fix_runs_once_per_batch():
    calls = []

    @batch_fix
    def fix(records):
        calls.append(len(records))
        return [r.payload.upper() if i % 2 == 0 else ValueError("odd") for i, r in enumerate(records)]

    outs = run_fix(fix, [rec(b"a"), rec(b"b"), rec(b"c")])
    assert calls == [3]
    assert [o.ok for o in outs] == [True, False, True]
    assert outs[2].payload == b"C"
    assert outs[1].error == "ValueError: odd"


def test_batch_fix_wrong_length_fails_every_record():
    @batch_fix
    def fix(records):
        return []

    assert [o.ok for o in run_fix(fix, [rec(), rec()])] == [False, False]


def test_load_fix(tmp_path, monkeypatch):
    (tmp_path / "my_fix_mod.py").write_text("def f(r):\n    return r.payload\nx = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert callable(load_fix("my_fix_mod:f"))
    with pytest.raises(FixLoadError, match="has no function 'x'"):
        load_fix("my_fix_mod:x")
    with pytest.raises(FixLoadError, match=r"cannot import module 'no_such_mod_xyz'.*fix_files"):
        load_fix("no_such_mod_xyz:f")
    sys.modules.pop("my_fix_mod", None)


@pytest.mark.parametrize(("code", "called"), [("sys.exit(3)", "sys.exit(3)"), ("os._exit(0)", "os._exit(0)")])
def test_a_fix_module_that_exits_when_imported_is_refused(tmp_path, monkeypatch, code, called):
    (tmp_path / "exiting_fix_mod.py").write_text(f"import os, sys\n{code}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(FixLoadError, match=rf"'exiting_fix_mod' .* called {re.escape(called)}; a fix module"):
        load_fix("exiting_fix_mod:f")
    sys.modules.pop("exiting_fix_mod", None)
    assert os._exit is REAL_EXIT


def test_a_fix_that_hangs_is_stopped_after_its_timeout():
    import time

    def hangs(record):
        time.sleep(30)
        return b"never"

    started = time.monotonic()
    out = run_fix(hangs, [rec(), rec()], timeout_s=0.2)
    assert time.monotonic() - started < 5
    assert [o.ok for o in out] == [False, False]
    assert out[0].error_class == "spark_apps.dlq_replay.fixes.FixTimeoutError"
    assert "fix_timeout_seconds (0.2 s)" in out[0].error_message
    assert not out[0].malformed


def test_the_time_limit_counts_each_call_on_its_own():
    """The timer is set once per batch: calls that together run longer than the limit, each within it,
    all succeed; the one call that runs past it is stopped."""
    import time

    def slow(record):
        time.sleep(1.5 if record.payload == b"slow" else 0.15)
        return record.payload

    records = [rec(b"a"), rec(b"b"), rec(b"c"), rec(b"slow"), rec(b"d")]
    started = time.monotonic()
    out = run_fix(slow, records, timeout_s=0.4)
    assert time.monotonic() - started < 1.5
    assert [o.ok for o in out] == [True, True, True, False, True]
    assert out[3].error_class == "spark_apps.dlq_replay.fixes.FixTimeoutError"


def test_a_batch_fix_that_spins_is_stopped_after_its_timeout():
    @batch_fix
    def spins(records):
        while True:
            pass

    out = run_fix(spins, [rec(), rec(), rec()], timeout_s=0.2)
    assert [o.error_class for o in out] == ["spark_apps.dlq_replay.fixes.FixTimeoutError"] * 3


def test_a_fix_returning_a_payload_too_big_for_pulsar_fails():
    from spark_apps.dlq_replay.fixes import MAX_FIX_PAYLOAD_BYTES

    out = run_fix(lambda r: b"x" * (MAX_FIX_PAYLOAD_BYTES + 1), [rec()])[0]
    assert not out.ok
    assert "maxMessageSize" in out.error_message
    assert run_fix(lambda r: b"x" * MAX_FIX_PAYLOAD_BYTES, [rec()])[0].ok
