"""The consumer-mode snapshot read in processes that keep their consumers open until the commit.

The embedded broker takes an ack only from the consumer a message was dispatched to. A snapshot read by
Spark tasks closes its consumers when the tasks end, so the commit had to receive every message of the
window again to ack the final ones: at 1M messages on 2 cores, 13-23 s at the client's own receive rate
(``docs/benchmarks.md``, twentieth round). With a local master and a local output root, the read tasks
(:class:`~spark_apps.dlq_replay.task_parquet.TaskWrites`, the same files as Spark's tasks write) run
instead in processes of the run's own, one per core, which keep their consumers
(:func:`~spark_apps.dlq_replay.pulsar_io.window_consumer.hold_reads`). The commit then sends each process
its whole entries (every message read and final) and the process acks each by its entry id from the
consumers that read it (:meth:`~spark_apps.dlq_replay.pulsar_io.window_consumer.ConsumerHold.ack_entries`):
no message is received twice.

Nothing changes for what is acked: an entry holding a message that is not final is never acked (nor any
of its messages: without batch-index acks the broker removes a batch only whole), and stays pending for
the next run, whose ledger marks its final messages as such. A process that ends without a commit
(the run failed, stopped, or acks nothing) closes its consumers: every message it read goes back to the
broker, pending. It also ends when the run's process does (its input closes).

Before it acks, the commit asks every process whether each held consumer holds every message its reads
returned (a read resumed after a stall, or the window sent again after a broker restart, can leave some
with no consumer of the process). Acks of those would be dropped, so then the processes are released and
the commit reads the window again as without them (:meth:`HeldReads.unsettled`).

Protocol, over the process's standard input and a copy of its standard output (its own standard output
goes to standard error, with the client's logs), each request length-prefixed: the job (``cloudpickle``:
the writes and the read task indexes), answered by one JSON line with the tallies; then requests (check,
or ack with the entries as an Arrow IPC stream), each answered by one JSON line, until an ack or the end
of input (release).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
from typing import IO, TYPE_CHECKING, Any

from spark_apps.dlq_replay.errors import HeldReadError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from spark_apps.dlq_replay.task_parquet import Tally, TaskWrites

log = logging.getLogger(__name__)

#: Spark setting: ``false`` keeps the snapshot's read in Spark tasks (and the commit's second read).
CONF_HELD_READS = "spark.dlq.replay.heldReads"
#: Seconds a process gets to close its consumers once released before it is killed.
RELEASE_TIMEOUT_S = 60.0
_LENGTH_BYTES = 8
#: The first byte of a request after the read: check the held consumers, or ack the entries that
#: follow (an Arrow IPC stream, empty for none).
_CHECK, _ACK = b"c", b"a"


def usable(spark: SparkSession) -> bool:
    """True when the snapshot's processes can run beside the driver: a ``local`` master (the tasks'
    files and the consumers on this machine), unless :data:`CONF_HELD_READS` is ``false``."""
    master = spark.sparkContext.master or ""
    enabled = str(spark.conf.get(CONF_HELD_READS, "true")).strip().lower() != "false"
    return enabled and master.startswith("local")


class HeldReads:
    """The processes that ran the snapshot's read tasks and hold its consumers (see the module docstring).

    Start them with :meth:`start`, wait for the read with :meth:`tallies`, then either :meth:`ack` the
    whole entries (which ends them) or :meth:`release` them; :meth:`release` is safe to call any time.
    """

    def __init__(self, processes: list[_Holder]) -> None:
        self._processes = processes

    @classmethod
    def start(cls, writes: TaskWrites, tasks: int, processes: int) -> HeldReads:
        """Run read tasks ``0 .. tasks-1`` of ``writes`` in up to ``processes`` processes (task ``i`` in
        process ``i % processes``, one task after another: threads of one process lose to its GIL)."""
        count = max(1, min(tasks, processes))
        holders: list[_Holder] = []
        try:
            for slot in range(count):
                holders.append(_Holder(writes, list(range(slot, tasks, count))))
        except BaseException:
            cls(holders).release()
            raise
        return cls(holders)

    def tallies(self) -> list[Tally]:
        """Wait for every read task; their tallies (as :func:`~.task_parquet.write_in_tasks` returns)."""
        try:
            rows: list[Tally] = []
            for holder in self._processes:
                answer = holder.answer("read")
                rows += [tuple(row) for row in answer["tallies"]]
            return rows
        except BaseException:
            self.release()
            raise

    def unsettled(self) -> list[str]:
        """The topic partitions whose entries cannot be acked through the held consumers
        (:meth:`~.pulsar_io.window_consumer.ConsumerHold.unsettled`): the commit must read the window
        again (after :meth:`release`). Acks nothing."""
        try:
            return [topic for holder in self._processes for topic in holder.request(_CHECK)["unsettled"]]
        except BaseException:
            self.release()
            raise

    def ack(self, whole: pa.Table) -> tuple[int, int]:
        """Ack the whole entries ``whole`` (``dlq_topic``, ``ledger_id``, ``entry_id``) from the consumers
        that read them, and end the processes; returns the entries acked and the messages the reads
        received past the window end (left pending)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        acked = beyond = 0
        try:
            topics = whole.column("dlq_topic")
            for holder in self._processes:
                held = pa.array(holder.topics(), pa.string())
                answer = holder.ack(whole.filter(pc.is_in(topics, value_set=held)) if len(held) else None)
                acked += int(answer["acked"])
                beyond += int(answer["beyond_window"])
        finally:
            self.release()
        return acked, beyond

    def release(self) -> None:
        """End every process that is still running: unacked messages go back to the broker."""
        processes, self._processes = self._processes, []
        for holder in processes:
            holder.end()


class _Holder:
    """One process of :class:`HeldReads`."""

    def __init__(self, writes: TaskWrites, indexes: list[int]) -> None:
        from pyspark import cloudpickle

        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self.indexes = indexes
        self._topics: list[str] = []
        self.process = subprocess.Popen(  # this interpreter and module; no user input
            [sys.executable, "-m", __name__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        assert self.process.stdin is not None
        job = cloudpickle.dumps((writes, indexes))
        try:
            _write_frame(self.process.stdin, job)
        except OSError as exc:
            raise HeldReadError(
                f"the snapshot's read process (pid {self.process.pid}) did not start: {exc}"
            ) from exc

    def answer(self, what: str) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            code = self.process.wait()
            raise HeldReadError(
                f"the snapshot's read process (pid {self.process.pid}, read tasks {self.indexes}) ended with "
                f"exit code {code} before its {what} answer; see its log lines above. Nothing was acked: "
                "run again (the messages are still pending)"
            )
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            self.end()
            raise HeldReadError(
                f"the snapshot's read tasks {self.indexes} failed: {answer['error']}. Nothing was acked: "
                "fix the cause and run again (the messages are still pending)"
            )
        if "topics" in answer:
            self._topics = list(answer["topics"])
        return answer

    def topics(self) -> list[str]:
        """The topic partitions this process holds consumers of."""
        return self._topics

    def ack(self, entries: pa.Table | None) -> dict[str, Any]:
        import pyarrow as pa

        sink = pa.BufferOutputStream()
        if entries is not None and len(entries):
            table = entries.select(["dlq_topic", "ledger_id", "entry_id"])
            with pa.ipc.new_stream(sink, table.schema) as stream:
                stream.write_table(table)
        return self.request(_ACK + sink.getvalue().to_pybytes())

    def request(self, payload: bytes) -> dict[str, Any]:
        """Send one request (:data:`_CHECK` or :data:`_ACK` and its entries) and wait for the answer."""
        if self.process.poll() is not None or self.process.stdin is None or self.process.stdin.closed:
            raise HeldReadError(
                f"the snapshot's read process (pid {self.process.pid}) ended before the commit; its "
                "messages are pending again and the next run acks the final ones"
            )
        try:
            _write_frame(self.process.stdin, payload)
        except OSError as exc:
            raise HeldReadError(
                f"the snapshot's read process (pid {self.process.pid}) stopped taking requests ({exc}); its "
                "messages are pending again and the next run acks the final ones"
            ) from exc
        return self.answer("commit")

    def end(self) -> None:
        process = self.process
        if process.stdin is not None and not process.stdin.closed:
            with contextlib.suppress(OSError):
                process.stdin.close()  # end of input: the process closes its consumers and exits
        try:
            process.wait(RELEASE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.warning(
                "the snapshot's read process %d did not end in %.0fs; killing it",
                process.pid,
                RELEASE_TIMEOUT_S,
            )
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
        if process.returncode:
            log.warning(
                "the snapshot's read process %d ended with exit code %d", process.pid, process.returncode
            )


def _write_frame(out: IO[bytes], payload: bytes) -> None:
    out.write(len(payload).to_bytes(_LENGTH_BYTES, "big"))
    out.write(payload)
    out.flush()


def _read_frame(source: IO[bytes]) -> bytes | None:
    """The next length-prefixed payload, or ``None`` at end of input."""
    head = source.read(_LENGTH_BYTES)
    if len(head) < _LENGTH_BYTES:
        return None
    size = int.from_bytes(head, "big")
    payload = source.read(size)
    if len(payload) < size:
        return None
    return payload


def _run_tasks(writes: TaskWrites, indexes: list[int]) -> list[list[int | None]]:
    """Run the read tasks ``indexes`` one after another; their tally rows, in task order."""
    import pyarrow as pa

    rows: list[list[int | None]] = []
    for index in indexes:
        ids = pa.record_batch([pa.array([index], pa.int64())], names=["id"])
        rows += [list(row.values()) for row in writes.run(iter([ids]), index, 0).to_pylist()]
    return rows


def _answer(hold: Any, request: bytes) -> dict[str, Any]:
    """The answer to one commit request; an ack request also closes the consumers (sending the acks)."""
    if request[:1] == _CHECK:
        return {"unsettled": hold.unsettled()}
    if request[:1] != _ACK:
        raise ValueError(f"unknown request {request[:1]!r}")
    acked = _ack(hold, request[1:])
    hold.close()
    return {"acked": acked, "beyond_window": sum(hold.beyond_window.values())}


def _ack(hold: Any, payload: bytes) -> int:
    import pyarrow as pa

    if not payload:
        return 0
    table = pa.ipc.open_stream(pa.py_buffer(payload)).read_all()
    acked = 0
    columns = [table.column(c).to_pylist() for c in ("dlq_topic", "ledger_id", "entry_id")]
    by_topic: dict[str, list[tuple[int, int]]] = {}
    for topic, ledger, entry in zip(*columns, strict=True):
        by_topic.setdefault(topic, []).append((int(ledger), int(entry)))
    for topic, entries in by_topic.items():
        acked += hold.ack_entries(topic, entries)
    return acked


def main() -> int:
    """The process: run the read tasks it is sent, hold their consumers, ack what the commit sends."""
    from spark_apps.dlq_replay.free_memory import return_free_memory
    from spark_apps.dlq_replay.pulsar_io.conf import CLIENT_LOGGER_NAME
    from spark_apps.dlq_replay.pulsar_io.window_consumer import hold_reads

    answers = os.fdopen(os.dup(1), "w")  # the protocol; everything printed goes to standard error
    os.dup2(2, 1)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger(CLIENT_LOGGER_NAME).setLevel(logging.WARNING)  # as the driver's (cli)
    source = sys.stdin.buffer
    hold = hold_reads()
    try:
        job = _read_frame(source)
        if job is None:
            return 0
        import pickle

        writes, indexes = pickle.loads(job)  # sent by the run's own driver, over a pipe
        try:
            rows = _run_tasks(writes, indexes)
        except Exception as exc:  # reported to the driver, which stops the run
            log.exception("held read tasks %s failed", indexes)
            answers.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n")
            answers.flush()
            return 1
        return_free_memory()  # the process stays until the commit: only its consumers need to
        answers.write(json.dumps({"tallies": rows, "topics": sorted(hold.consumers)}) + "\n")
        answers.flush()
        while (request := _read_frame(source)) is not None:  # end of input: released, nothing acked
            answers.write(json.dumps(_answer(hold, request)) + "\n")
            answers.flush()
            if request[:1] == _ACK:
                break
        return 0
    finally:
        hold.close()


def _exit(code: int) -> None:
    """End the process once its consumers and client are closed and its output flushed, skipping the
    interpreter's shutdown: the Pulsar client's native threads can abort it there even after the client
    is closed (``terminate called without an active exception``, exit code -6; see also
    apache/pulsar-client-python#256), which would hide the process's own exit code."""
    from spark_apps.dlq_replay.pulsar_io.conf import close_own_clients

    try:
        close_own_clients()
    finally:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    try:
        _code = main()
    except BaseException:
        log.exception("the snapshot's read process failed")
        _code = 1
    _exit(_code)
