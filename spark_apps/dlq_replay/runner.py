"""Run orchestration: the steps of a replay run under a run id, resumable, with progress logs.

plan -> snapshot -> decide -> [dry-run stops] -> apply -> record -> commit -> report. Each step reads
the previous step's durable output, writes its own, and is recorded complete in ``state.json`` only
after that; a re-run of the run id skips complete steps. See ``docs/replay-app.md``.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay.errors import ReplayConfigError
from spark_apps.dlq_replay.options import DEDUP_WAVE_SIZE, DEFAULT_WAVE_SIZE
from spark_apps.dlq_replay.progress import MESSAGE_STEPS, StepProgress
from spark_apps.dlq_replay.pulsar_io.errors import PulsarConfigError
from spark_apps.dlq_replay.storage import RunStorage, join, qualify_root

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession

    from spark_apps.dlq_replay.lock import RunLock
    from spark_apps.dlq_replay.options import ReplayOptions
    from spark_apps.dlq_replay.playbook import Playbook
    from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf
    from spark_apps.dlq_replay.pulsar_io.window import PartitionWindow
    from spark_apps.dlq_replay.report_parts import ReportParts
    from spark_apps.dlq_replay.state import RunState
    from spark_apps.dlq_replay.task_parquet import SideOutput
    from spark_apps.dlq_replay.task_sends import SendFilter

log = logging.getLogger("spark_apps.dlq_replay")


class RunPaths:
    """Where a run writes (see ``docs/replay-app.md``)."""

    def __init__(self, output_dir: str, run_id: str) -> None:
        from spark_apps.dlq_replay.state import run_dir_name

        self.root = qualify_root(output_dir)
        self.run = join(self.root, "runs", run_dir_name(run_id))
        self.plan = join(self.run, "plan.json")
        self.state = join(self.run, "state.json")
        self.snapshot = join(self.run, "snapshot")
        self.identities = join(self.run, "snapshot_identities")
        self.snapshot_entries = join(self.run, "snapshot_entries")
        self.commit_parts = join(self.run, "commit_parts")
        self.decisions = join(self.run, "decisions")
        self.republish_results = join(self.run, "apply", "republish")
        self.canary_ids = join(self.run, "apply", "canary_ids")
        self.report_json = join(self.run, "report.json")
        self.report_html = join(self.run, "report.html")
        self.archive = join(self.root, "archive")
        self.archive_staged = join(self.run, "archive_staged")
        self.ledger = join(self.root, "ledger")
        self.ledger_staged = join(self.run, "ledger_staged")
        self.report_parts = join(self.run, "report_parts")

    def public(self) -> dict[str, str]:
        return {
            "report_json": self.report_json,
            "report_html": self.report_html,
            "archive": self.archive,
            "ledger": self.ledger,
            "snapshot": self.snapshot,
        }


def _load_state(storage: RunStorage, paths: RunPaths, options: ReplayOptions, playbook: Playbook) -> RunState:
    """The state to continue with (read only): a new one, or the existing one when the options match;
    raises :class:`~spark_apps.dlq_replay.errors.OptionsChangedError` otherwise."""
    from spark_apps.dlq_replay.state import RunState, resume_or_start

    text = storage.read_text(paths.state)
    existing = RunState.from_json(text, where=paths.state) if text else None
    fingerprint = options.fingerprint_options(playbook.digest)
    return resume_or_start(existing, options.run_id, options.mode, fingerprint)


class _Run:
    """One invocation of a run id: options, state, the lock it holds and the step helpers."""

    def __init__(
        self,
        spark: SparkSession,
        options: ReplayOptions,
        playbook: Playbook,
        conf: PulsarConf,
        lock: RunLock | None = None,
    ) -> None:
        self.spark = spark
        self.progress = StepProgress(spark)
        self.options = options
        self.playbook = playbook
        self.conf = conf
        self.lock = lock
        self.paths = RunPaths(options.output_dir, options.run_id)
        self.storage = RunStorage()
        self.state: RunState = _load_state(self.storage, self.paths, options, playbook)
        self.save()

    def save(self) -> None:
        self.storage.write_text(self.paths.state, self.state.to_json())

    def check_lock(self) -> None:
        """Stop when another run took the lock or lease over (never interleave two runs)."""
        if self.lock is not None:
            self.lock.check()

    def step(self, name: str) -> bool:
        """True when ``name`` must run now (logs the skip otherwise)."""
        self.check_lock()
        if self.state.is_complete(name):
            log.info("step %s: already complete in an earlier attempt, skipped", name)
            return False
        self.state.progress(name)["status"] = "running"
        self.state.progress(name)["started_at"] = datetime.now(UTC).isoformat(timespec="milliseconds")
        self.save()
        log.info("step %s: started", name)
        self.progress.start(name, self.expected(name), count_rows=name in MESSAGE_STEPS)
        return True

    def expected(self, name: str) -> int | None:
        """Messages step ``name`` handles, for its progress lines."""
        from spark_apps.dlq_replay.progress import expected_total

        return expected_total(self.state, name, self.progress.expected_snapshot())

    def done(self, name: str, started: float, **info: Any) -> None:
        self.progress.stop()
        self.check_lock()  # a step whose jobs were cancelled must not be recorded complete
        seconds = time.monotonic() - started
        self.state.mark_complete(name, seconds, **info)
        self.save()
        details = " ".join(f"{k}={v}" for k, v in info.items() if not isinstance(v, (dict, list)))
        log.info("step %s: complete in %.1fs %s", name, seconds, details)

    @property
    def buckets(self) -> int:
        from spark_apps.dlq_replay.session import default_parallelism

        return max(1, self.options.parallelism or default_parallelism(self.spark))


def _plan(run: _Run) -> tuple[list[PartitionWindow], datetime]:
    from spark_apps.dlq_replay.pulsar_io.window import (
        CONSUMER_MODE,
        freeze,
        windows_from_json,
        windows_to_json,
    )

    if run.step("plan"):
        started = time.monotonic()
        settled: list[dict[str, Any]] = []
        if run.options.window_from:  # the window a reviewer saw (docs/approval.md)
            from spark_apps.dlq_replay.group_actions import reuse_window
            from spark_apps.dlq_replay.pulsar_io.window import FrozenWindows, read_mode_of

            earlier = RunPaths(run.options.output_dir, run.options.window_from).plan
            reused = reuse_window(
                run.storage, earlier, run.options.window_from, run.options.topics, run.options.subscription
            )
            reason = f"the window of the reviewed run {run.options.window_from}"
            frozen = FrozenWindows(reused, read_mode_of(reused), reason)
            windows = frozen.windows
        else:
            frozen = freeze(run.conf, list(run.options.topics), run.options.subscription)
            windows = frozen.windows
            if frozen.read_mode == CONSUMER_MODE:  # reader mode reads the cursor's pending entries only
                windows, settled = _settle_windows(run, frozen.windows)
        planned_at = datetime.now(UTC)
        plan = {
            "run_id": run.options.run_id,
            "mode": run.options.mode,
            "planned_at": planned_at.isoformat(timespec="milliseconds"),
            "topics": list(run.options.topics),
            "subscription": run.options.subscription,
            "read_mode": frozen.read_mode,
            "read_mode_reason": frozen.reason,
            "window": windows_to_json(windows),
            "frozen_window": windows_to_json(frozen.windows),
            "settled": settled,
            "options": run.state.options,
        }
        run.storage.write_text(run.paths.plan, json.dumps(plan, indent=2, sort_keys=True))
        log.info("step plan: read mode %s (%s)", frozen.read_mode, frozen.reason)
        run.done(
            "plan",
            started,
            partitions=len(windows),
            empty_partitions=sum(w.end_message_id is None for w in windows),
            settled_partitions=len(settled),
            read_mode=frozen.read_mode,
            pending_entries=sum(w.pending_entries for w in windows),
        )
    text = run.storage.read_text(run.paths.plan)
    if text is None:
        from spark_apps.dlq_replay.errors import RunStateError

        raise RunStateError(
            f"{run.paths.plan} is missing although the plan step is complete; use a new --run-id"
        )
    plan = json.loads(text)
    return windows_from_json(plan["window"]), datetime.fromisoformat(plan["planned_at"])


def _settle_windows(
    run: _Run, frozen: list[PartitionWindow]
) -> tuple[list[PartitionWindow], list[dict[str, Any]]]:
    """End each partition whose last message an earlier run already made final at the last entry the
    ledger knows pending (see :func:`~spark_apps.dlq_replay.ledger.settled_ends`): without it a read
    would wait for a message it can never receive, twice the idle timeout per partition."""
    from dataclasses import asdict, replace

    from spark_apps.dlq_replay.ledger import read_ledger, settled_ends

    ledger = read_ledger(run.spark, run.storage, run.paths.ledger)
    if ledger is None:
        return frozen, []

    def commit_done(run_id: str) -> bool:
        from spark_apps.dlq_replay.state import RunState, run_dir_name

        path = join(run.paths.root, "runs", run_dir_name(run_id), "state.json")
        text = run.storage.read_text(path)
        if not text:
            return False
        state = RunState.from_json(text, where=path)
        return state.is_complete("commit") and not int(state.info("commit").get("unacked_final", 0))

    ends = {e.topic: e for e in settled_ends(ledger, frozen, commit_done)}
    for end in ends.values():
        log.info(
            "plan: the last message of %s is final in run(s) %s; reading it up to %s",
            end.topic,
            ", ".join(end.settled_by),
            end.end_message_id or "nothing (no message left pending there)",
        )
    windows = [
        replace(w, end_message_id=ends[w.topic].end_message_id) if w.topic in ends else w for w in frozen
    ]
    return windows, [asdict(e) for e in ends.values()]


def _snapshot(run: _Run, windows: list[PartitionWindow]) -> DataFrame:
    """Read the window in Spark tasks that write the snapshot (and its entries and identities) themselves."""
    from spark_apps.dlq_replay.pulsar_io.window import READER_MODE, read_mode_of, windows_to_json
    from spark_apps.dlq_replay.schemas import SNAPSHOT_SCHEMA
    from spark_apps.dlq_replay.task_parquet import read_frame

    if run.step("snapshot"):
        from spark_apps.dlq_replay import task_parquet
        from spark_apps.dlq_replay.commit_parts import entry_rows, snapshot_entries_schema
        from spark_apps.dlq_replay.pulsar_io.source import read_tasks

        started = time.monotonic()
        mode = read_mode_of(windows)
        # Readers split a partition's pending entries into contiguous shares: by default enough of them to
        # keep every core busy (the source gives each share a minimum of entries). Consumer mode reads each
        # partition with one consumer, which drops a redelivered copy by its id.
        parallelism = 1
        if mode == READER_MODE:
            busy = max(1, sum(1 for w in windows if w.pending))
            parallelism = run.options.parallelism or max(1, -(-run.buckets // busy))
        source_options = {
            **run.conf.to_options(),
            "topics": ",".join(run.options.topics),
            "subscription": run.options.subscription,
            "window": windows_to_json(windows),
            "parallelism": str(parallelism),
            "idle.timeout.ms": str(run.options.idle_timeout_ms),
        }
        frame, read_task, _, _ = read_tasks(run.spark, source_options, mark_entries=True)
        # Beside the rows: unless --max-messages needs the whole context, their replay ids (the decide
        # step's duplicate marks read those few columns), and each batch's entries (the commit's counts).
        with_identities = run.options.max_messages is None
        run.progress.count_files(run.paths.snapshot)
        counts = task_parquet.SideOutput(run.paths.snapshot_entries, snapshot_entries_schema(), entry_rows)
        main = task_parquet.main_output(run.paths.snapshot, SNAPSHOT_SCHEMA)
        outputs = [main, counts, *([_identities_output(run)] if with_identities else [])]
        writes = task_parquet.TaskWrites(read_task, outputs, _entries_tally, ("n", "entries"))
        tallies = writes.in_spark(frame)
        writes.seal()
        count = sum(t[0] or 0 for t in tallies)
        info: dict[str, Any] = {
            "read_mode": mode,
            "readers_per_partition": parallelism,
            "identities_written": with_identities,
        }
        if mode == READER_MODE:
            entries = sum(t[1] or 0 for t in tallies)
            planned = sum(w.pending_entries for w in windows)
            info.update(pending_entries=planned, entries_read=entries, unread_entries=planned - entries)
            if planned != entries:
                log.warning(
                    "step snapshot: %d of %d pending entries were not read; they stay pending for the next "
                    "run",
                    planned - entries,
                    planned,
                )
        run.done("snapshot", started, messages=count, dlq_reads=count, **info)
    return read_frame(run.spark, run.paths.snapshot, SNAPSHOT_SCHEMA)


def _identities_output(run: _Run) -> SideOutput:
    """The snapshot rows' :func:`~spark_apps.dlq_replay.scope.identity_rows`, written by the read tasks."""
    from spark_apps.dlq_replay import task_parquet
    from spark_apps.dlq_replay.schemas import IDENTITIES_SCHEMA
    from spark_apps.dlq_replay.scope import identity_rows

    precedence = run.playbook.origin_precedence
    return task_parquet.SideOutput(
        run.paths.identities, IDENTITIES_SCHEMA, lambda batch: identity_rows(batch, precedence)
    )


def _arrow_batch_rows(run: _Run) -> int:
    """Rows per Arrow batch of the run's Python tasks (Spark's ``maxRecordsPerBatch``)."""
    return int(run.spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch") or 10_000)


def _entries_tally(batch: pa.RecordBatch) -> tuple[int, int]:
    """``(rows, entries)`` of a batch of snapshot rows marked with their entries' first rows."""
    from spark_apps.dlq_replay.pulsar_io.source import ENTRY_FIRST

    return batch.num_rows, batch.column(ENTRY_FIRST).true_count


def _decide(run: _Run, snapshot: DataFrame, planned_at: datetime) -> DataFrame:
    """Decide in one Spark task per producer bucket, each reading its share of the snapshot's files and
    writing its decisions (and, unless a dry-run, its archived rows) itself."""
    from spark_apps.dlq_replay import task_parquet
    from spark_apps.dlq_replay.archive_files import staged_output
    from spark_apps.dlq_replay.decide import DecideSettings, decide_tasks
    from spark_apps.dlq_replay.free_memory import return_free_memory
    from spark_apps.dlq_replay.ledger import final_ids, read_ledger
    from spark_apps.dlq_replay.schemas import DECIDED_SCHEMA
    from spark_apps.dlq_replay.scope import Filters
    from spark_apps.dlq_replay.task_sends import wave_blocks

    opts = run.options
    if run.step("decide"):
        started = time.monotonic()
        ledger = read_ledger(run.spark, run.storage, run.paths.ledger)
        filters = Filters(opts.signatures, opts.error_class, opts.since, opts.until, opts.max_messages)
        settings = DecideSettings(
            run_id=opts.run_id,
            mode=opts.mode,
            max_replays=opts.max_replays,
            allowlist=opts.allowlist_matcher(),
            archive_payload=opts.archive_payload,
            group_actions=opts.group_actions,
        )
        identities = _snapshot_identities(run)
        frame, decide_task = decide_tasks(
            snapshot,
            run.playbook,
            settings,
            run.buckets,
            filters=filters,
            final_ids=final_ids(ledger, exclude_run_id=opts.run_id),
            reviewed_ids=_reviewed_ids(run),
            snapshot_dir=run.paths.snapshot,
            batch_rows=_arrow_batch_rows(run),
            identities=identities,
        )
        return_free_memory()  # the marks' working memory, before the driver waits out decide and apply
        # The archived rows are staged beside the decisions; apply moves them into the archive.
        staged = opts.mode != oc.DRY_RUN
        sides = [staged_output(run.paths.archive_staged, planned_at)] if staged else []
        run.progress.count_files(run.paths.decisions)
        tallies = task_parquet.write_in_tasks(
            frame,
            decide_task,
            DECIDED_SCHEMA,
            run.paths.decisions,
            _sending_tally,
            ("n", "last"),
            sides,
            row_groups_by=wave_blocks(opts.wave_size or DEFAULT_WAVE_SIZE),  # each wave's own row groups
        )
        lasts = [t[1] for t in tallies if t[1] is not None]
        last = max(lasts, default=None)
        run.done(
            "decide",
            started,
            to_republish=sum(t[0] or 0 for t in tallies),
            max_sequence_id=int(last) if last is not None else -1,
            producers_per_target=run.buckets,
        )
    return task_parquet.read_frame(run.spark, run.paths.decisions, DECIDED_SCHEMA)


def _snapshot_identities(run: _Run) -> DataFrame | None:
    """The identities the snapshot's read tasks wrote beside it, or ``None`` (not written)."""
    if not run.state.info("snapshot").get("identities_written"):
        return None
    from spark_apps.dlq_replay.schemas import IDENTITIES_SCHEMA
    from spark_apps.dlq_replay.task_parquet import read_frame

    return read_frame(run.spark, run.paths.identities, IDENTITIES_SCHEMA)


def _sending_tally(batch: pa.RecordBatch) -> tuple[int, int | None]:
    """``(rows to republish, their highest sequence id or None)`` of a batch of decisions."""
    import pyarrow.compute as pc

    sending = pc.equal(batch.column("outcome"), oc.TO_REPUBLISH)
    n = int(pc.sum(sending.cast("int64")).as_py() or 0)
    last = pc.max(pc.filter(batch.column("sequence_id"), sending)).as_py() if n else None
    return n, last


def _reviewed_ids(run: _Run) -> DataFrame | None:
    """With ``--window-from``: the replay ids the reviewed run had in scope (it acts on nothing else)."""
    if not run.options.window_from:
        return None
    from spark_apps.dlq_replay.group_actions import reviewed_ids

    return reviewed_ids(run.spark, RunPaths(run.options.output_dir, run.options.window_from).decisions)


def _apply(run: _Run, decisions: DataFrame, planned_at: datetime) -> None:
    to_send = int(run.state.info("decide").get("to_republish", 0))
    if run.step("apply"):
        started = time.monotonic()
        progress = run.state.progress("apply")
        if not progress.get("archive_written"):
            _archive(run, planned_at)
            progress["archive_written"] = True
            run.save()
            log.info("step apply: archive written to %s", run.paths.archive)
        published = failed = 0
        if to_send:
            around: SendFilter | None = None
            unsent = 0
            if run.options.canary:  # canary first; halted groups are not sent (docs/canary.md)
                from spark_apps.dlq_replay.canary import run_canary, unsent_halted
                from spark_apps.dlq_replay.task_sends import SendFilter

                halted = run_canary(run, decisions, lambda chosen, path: _send_all(run, chosen, path))
                around = SendFilter(run.paths.canary_ids, canary=False, halted=tuple(halted))
                unsent = unsent_halted(run, decisions, halted)
            _republish_in_waves(run, decisions, to_send, around)
            published = _published(run)
            failed = to_send - published - unsent
            if failed:
                log.warning("step apply: %d messages could not be published; they stay pending", failed)
        run.done(
            "apply",
            started,
            published=published,
            publish_failed=failed,
            resent=int(progress.get("resent", 0)),
            resent_held=int(progress.get("resent_held", 0)),
            resend_bound=int(progress.get("resend_bound", 0)),
        )


def _published(run: _Run) -> int:
    """Messages the waves saved as published (the results' ``published`` column, read in the driver a
    column at a time: one row per message never reaches it)."""
    import pyarrow.compute as pc

    from spark_apps.dlq_replay.storage import open_parquet
    from spark_apps.dlq_replay.task_parquet import data_files

    total = 0
    for path in data_files(run.paths.republish_results):
        for batch in open_parquet(path).iter_batches(
            batch_size=65_536, columns=["published"], use_threads=False
        ):
            total += pc.fill_null(batch.column(0), False).true_count
    return total


def _archive(run: _Run, planned_at: datetime) -> None:
    """Move the decide tasks' staged archive files into this run's archive partitions."""
    from spark_apps.dlq_replay.archive_files import publish_staged

    publish_staged(
        run.paths.archive_staged, run.paths.archive, planned_at.strftime("%Y-%m-%d"), run.options.run_id
    )


def _send_all(run: _Run, chosen: SendFilter, path: str) -> None:
    """Send the rows ``chosen`` picks from every sequence id (a canary) and save the results at ``path``."""
    _send_wave(run, (0, int(run.state.info("decide").get("max_sequence_id", -1)) + 1), path, chosen)


def _send_wave(run: _Run, sequence_range: tuple[int, int], path: str, chosen: SendFilter | None) -> None:
    from spark_apps.dlq_replay.task_sends import send_wave

    send_wave(
        run.spark,
        run.paths.decisions,
        int(run.state.info("decide").get("producers_per_target") or run.buckets),
        sequence_range,
        run.conf,
        path,
        batch_rows=_arrow_batch_rows(run),
        rate_limit_per_s=run.options.rate_limit,
        only=chosen,
    )


def _republish_in_waves(run: _Run, decisions: DataFrame, to_send: int, around: SendFilter | None) -> None:
    """Send in waves of ``--wave-size`` sequence ids per producer, each saved before the next starts.

    Each wave's tasks read their producer bucket's decisions file themselves
    (:mod:`~spark_apps.dlq_replay.task_sends`); after a canary, ``around`` leaves out the canary rows
    and the halted groups. A wave whose results are saved (``_SUCCESS``) is never sent
    again; a wave an earlier attempt started but did not save is sent again whole, and its size is
    counted as ``resent``: on a broker without deduplication up to that many messages reach the origin
    twice (with the same ``REPLAY_ID``); with deduplication the same producer names and sequence ids
    make the re-send exact.
    """
    progress = run.state.progress("apply")
    decided = run.state.info("decide")
    last = int(decided.get("max_sequence_id", -1))
    if not progress.get("wave_size"):
        progress["wave_size"] = _wave_size(run, last)
        run.save()
    size = int(progress["wave_size"])
    waves = last // size + 1
    for wave in range(waves):
        run.check_lock()
        path = join(run.paths.republish_results, f"wave={wave}")
        if run.storage.exists(join(path, "_SUCCESS")):
            run.progress.count_files(path)  # its messages count as done
            log.info(
                "step apply: wave %d/%d was sent by an earlier attempt, not sending again", wave + 1, waves
            )
            continue
        again = progress.get("wave_in_flight") == wave
        log.info(
            "step apply: republishing wave %d/%d (sequence ids %d-%d per producer, %d messages in all)%s",
            wave + 1,
            waves,
            wave * size,
            (wave + 1) * size - 1,
            to_send,
            "; an earlier attempt was killed while sending it, so it is sent again" if again else "",
        )
        # Attempts that started this wave: each one killed before saving it may have sent all of it.
        progress["wave_starts"] = int(progress.get("wave_starts", 1)) + 1 if again else 1
        progress["wave_in_flight"] = wave
        run.save()
        run.progress.count_files(path)
        _send_wave(run, (wave * size, (wave + 1) * size), path, around)
        if again:
            restarts = int(progress["wave_starts"]) - 1
            _count_resend(run, decisions, path, (wave * size, (wave + 1) * size), restarts)
        progress["waves_done"] = wave + 1
        progress.pop("wave_in_flight", None)
        progress.pop("wave_starts", None)
        run.save()


def _count_resend(
    run: _Run, decisions: DataFrame, results: str, sequence_range: tuple[int, int], restarts: int
) -> None:
    """Count a wave that ``restarts`` killed attempts had started (``apply`` progress): ``resent`` its
    messages once per such attempt (each may have sent all of them), ``resent_held`` the messages the
    broker already held and dropped when the wave was sent to the end (deduplication), and
    ``resend_bound`` the wave size x the producers that send in it, once per such attempt: the most that
    can reach the origins twice without deduplication."""
    from pyspark.sql import functions as F

    progress = run.state.progress("apply")
    lo, hi = sequence_range
    from spark_apps.dlq_replay.schemas import RESULTS_SCHEMA
    from spark_apps.dlq_replay.task_parquet import read_frame

    sent = read_frame(run.spark, results, RESULTS_SCHEMA).agg(
        F.count(F.lit(1)).alias("n"),
        F.count_if(F.col("published_message_id").startswith("-1:")).alias("held"),
    )
    counts = sent.first()
    in_wave = (
        (F.col("outcome") == oc.TO_REPUBLISH) & (F.col("sequence_id") >= lo) & (F.col("sequence_id") < hi)
    )
    producers = decisions.filter(in_wave).agg(F.count_distinct("replay_producer").alias("p")).first()
    for key, n in (
        ("resent", restarts * int(counts["n"] if counts else 0)),
        ("resent_held", int(counts["held"] if counts else 0)),
        ("resend_bound", restarts * (hi - lo) * int(producers["p"] if producers else 0)),
    ):
        progress[key] = int(progress.get(key, 0)) + n


def _wave_size(run: _Run, last: int) -> int:
    """``--wave-size``, else :data:`~spark_apps.dlq_replay.options.DEDUP_WAVE_SIZE` when the broker
    deduplicates every target topic (a re-sent wave is dropped there), else the small default that bounds
    a re-send after a kill (``docs/reliability.md``). ``last``: the highest sequence id of any producer."""
    from spark_apps.dlq_replay.pulsar_io.dedup import deduplication
    from spark_apps.dlq_replay.task_sends import sending_targets

    if run.options.wave_size is not None:
        return run.options.wave_size
    if last < DEFAULT_WAVE_SIZE:
        return DEFAULT_WAVE_SIZE  # one wave either way: no need to ask the broker
    targets = sorted(sending_targets(run.paths.decisions))  # the decide tasks' files, read in the driver
    dedup = deduplication(run.conf, targets)
    size = DEDUP_WAVE_SIZE if dedup.on else DEFAULT_WAVE_SIZE
    log.info("step apply: waves of %d sequence ids per producer (%s)", size, dedup.reason)
    return size


def _record(run: _Run) -> None:
    """Write the run's ledger rows: the record tasks zip each bucket's decisions with its send results
    (and write the report's and the commit's counts beside them)."""
    from spark_apps.dlq_replay.canary import halted_groups
    from spark_apps.dlq_replay.ledger_files import publish_staged, record_in_tasks

    if run.step("record"):
        started = time.monotonic()
        recorded_at = datetime.now(UTC)
        run.progress.count_files(run.paths.ledger_staged)
        record_in_tasks(
            run.spark,
            run.paths.decisions,
            run.paths.republish_results,
            int(run.state.info("decide").get("producers_per_target") or run.buckets),
            run.paths.ledger_staged,
            mode=run.options.mode,
            recorded_at=recorded_at,
            batch_rows=_arrow_batch_rows(run),
            halted=tuple(halted_groups(run)),
            parts_dir=run.paths.report_parts,
            commit_dir=run.paths.commit_parts,
        )
        publish_staged(run.paths.ledger_staged, run.paths.ledger, run.options.run_id)
        run.done("record", started, recorded_at=recorded_at.isoformat())


def _commit(run: _Run, windows: list[PartitionWindow]) -> None:
    from spark_apps.dlq_replay.pulsar_io.window import READER_MODE, read_mode_of

    resumed = "commit" in run.state.steps  # an earlier attempt may already have acked some of them
    if not run.step("commit"):
        return
    started = time.monotonic()
    mode = read_mode_of(windows)
    if mode == READER_MODE:
        totals = _commit_entries(run, windows)
    else:
        totals = _commit_by_consumers(run, windows, resumed)
    if totals["unacked_final"]:
        log.warning(
            "commit: %d final messages could not be acked; they stay pending", totals["unacked_final"]
        )
    snapshot_reads = int(run.state.info("snapshot").get("dlq_reads", 0))
    reads = snapshot_reads + totals["messages_read"]
    run.done(
        "commit",
        started,
        read_mode=mode,
        acked=totals["acked"],
        acked_by_earlier_attempts=totals.get("acked_by_earlier_attempts", 0),
        left_pending_seen=totals["left_pending"],
        beyond_window=totals["beyond_window"],
        unacked_final=totals["unacked_final"],
        final_in_partial_entries=totals["final_in_partial_entries"],
        entries_acked=totals["entries_acked"],
        final_in_whole_entries=totals.get("final_in_whole_entries", 0),
        dlq_reads_snapshot=snapshot_reads,
        dlq_reads_commit=totals["messages_read"],
        reads_per_message=round(reads / snapshot_reads, 3) if snapshot_reads else 0.0,
    )


_TOTAL_COLUMNS = (
    "acked",
    "left_pending",
    "beyond_window",
    "final_in_partial_entries",
    "unacked_final",
    "entries_acked",
    "messages_read",
)


def _sum_rows(rows: DataFrame) -> dict[str, int]:
    totals = dict.fromkeys(_TOTAL_COLUMNS, 0)
    for row in rows.collect():  # one row per DLQ partition
        for name in _TOTAL_COLUMNS:
            totals[name] += int(row[name] or 0)
    return totals


def _commit_entries(run: _Run, windows: list[PartitionWindow]) -> dict[str, int]:
    """Reader mode: ack the snapshot's fully final entries by id, verified on the cursor; no DLQ read
    (one task per partition, from the read and record tasks' counts)."""
    from spark_apps.dlq_replay.commit_parts import commit_in_tasks

    paths = run.paths
    results = commit_in_tasks(
        run.spark, paths.snapshot_entries, paths.commit_parts, run.conf, windows, run.options.subscription
    )
    return {name: sum(int(row[name] or 0) for row in results) for name in _TOTAL_COLUMNS}


def _entry_of_id() -> list[Column]:
    """``ledger_id`` and ``entry_id`` of a row's ``dlq_message_id`` (``ledger:entry:partition:batch``)."""
    from pyspark.sql import functions as F

    ids = F.split(F.col("dlq_message_id"), ":")
    return [ids[0].cast("long").alias("ledger_id"), ids[1].cast("long").alias("entry_id")]


def _counted_entries(run: _Run) -> pa.Table:
    """Per entry of the snapshot, its messages and final messages, as the record tasks counted them
    (:func:`~spark_apps.dlq_replay.commit_parts.entry_table`)."""
    from spark_apps.dlq_replay.commit_parts import entry_table

    return entry_table(run.paths.snapshot_entries, run.paths.commit_parts)


def _commit_by_consumers(run: _Run, windows: list[PartitionWindow], resumed: bool) -> dict[str, int]:
    """Consumer mode: read the window again and ack the final messages from the receiving consumer."""
    from spark_apps.dlq_replay.arrow_compat import apply_in_arrow
    from spark_apps.dlq_replay.pulsar_io.commit import COMMIT_RESULT_SCHEMA, make_commit_fn

    final, expected, unread, in_whole, in_partial = _final_by_entries(run, windows, _counted_entries(run))
    totals = dict.fromkeys(_TOTAL_COLUMNS, 0)
    totals["final_in_whole_entries"] = in_whole
    if final is not None:
        fn = make_commit_fn(run.conf, windows, run.options.subscription, run.options.idle_timeout_ms)
        grouped = final.repartition(max(1, len(windows)), "dlq_topic").groupBy("dlq_topic")

        def commit_group(table: pa.Table) -> pa.Table:
            return fn(table)

        totals.update(_sum_rows(apply_in_arrow(grouped, commit_group, COMMIT_RESULT_SCHEMA)))
    # Every final message of a first commit attempt was pending (the snapshot read it unacked): any not
    # acked now was missed (e.g. a broker stall) and stays pending until the next run acks it. In a
    # resumed commit, final messages not received were acked by the killed attempt (one run at a time
    # holds the subscription): they count as acked too, so the total is exact across attempts.
    # Partitions without a final message are not read: all their messages of this run stay pending.
    acked_this_attempt = totals["acked"]
    totals["acked_by_earlier_attempts"] = max(0, expected - acked_this_attempt) if resumed else 0
    totals["acked"] = acked_this_attempt + totals["acked_by_earlier_attempts"]
    totals["left_pending"] += unread
    totals["final_in_partial_entries"] += in_partial
    totals["unacked_final"] = 0 if resumed else max(0, expected - acked_this_attempt)
    return totals


class _Finals(NamedTuple):
    """The consumer-mode commit's input: the final messages to ack (None: there are none), how many, the
    messages of partitions without a final one, how many final messages make up whole entries, and how
    many are left pending because their entry holds a pending one."""

    frame: DataFrame | None
    expected: int
    unread: int
    in_whole_entries: int
    in_partial_entries: int = 0


def _final_by_entries(run: _Run, windows: list[PartitionWindow], table: pa.Table) -> _Finals:
    """The final messages as whole entries (from the tasks' counts, in the driver), as
    :data:`~.pulsar_io.commit.ENTRIES_COMMIT_INPUT_SCHEMA` rows. The final messages of entries that also
    hold a pending one are not sent: without batch-index acks the broker removes a batch only whole, so
    they stay pending with their entry, counted in ``final_in_partial_entries``."""
    from spark_apps.dlq_replay.arrow_compat import arrow_frame
    from spark_apps.dlq_replay.commit_parts import ConsumerCommit
    from spark_apps.dlq_replay.pulsar_io.commit import ENTRIES_COMMIT_INPUT_SCHEMA

    split = ConsumerCommit(table, windows)
    final = arrow_frame(run.spark, split.whole, ENTRIES_COMMIT_INPUT_SCHEMA) if len(split.whole) else None
    log.info(
        "step commit: %d final messages, %d in %d whole entries, the rest in %d entries with a pending "
        "message (left pending with them)",
        split.expected,
        split.in_whole,
        len(split.whole),
        len(split.partial),
    )
    return _Finals(final, split.in_whole, split.unread, split.in_whole, split.expected - split.in_whole)


def run_replay(
    spark: SparkSession, options: ReplayOptions, *, broker_checked: bool = False
) -> dict[str, Any]:
    """Run (or resume) the replay run ``options.run_id``; returns the report (also written as JSON/HTML).

    Everything is checked before anything is written (:mod:`~spark_apps.dlq_replay.preflight`); the run
    then holds the output directory lock and the subscription leases (:mod:`~spark_apps.dlq_replay.lock`)
    until it ends. ``broker_checked``: the caller already ran
    :func:`~spark_apps.dlq_replay.broker_checks.check_broker` (the command line does, before Spark).
    """
    from spark_apps.dlq_replay.lock import run_lock
    from spark_apps.dlq_replay.preflight import check_with_spark
    from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf

    playbook = check_with_spark(spark, options)
    conf = PulsarConf.from_app_options(options)
    paths = RunPaths(options.output_dir, options.run_id)
    storage = RunStorage()
    state = _load_state(storage, paths, options, playbook)  # a resume with changed options stops here
    if state.is_complete("report"):
        text = storage.read_text(paths.report_json)
        if text:
            log.info("run %s is already complete; nothing to do", options.run_id)
            report: dict[str, Any] = json.loads(text)
            return report
    _check_before_writing(
        storage, paths, options, conf, resumed="plan" in state.steps, broker=not broker_checked
    )
    created = _Created(storage, paths)
    try:
        with run_lock(
            spark,
            paths.root,
            options.run_id,
            conf=conf if options.subscription_lease else None,
            topics=options.topics,
            subscription=options.subscription,
            storage=storage,
        ) as lock:
            run = _Run(spark, options, playbook, conf, lock)
            try:
                return _run_steps(run)
            finally:
                run.progress.stop()  # a step that raised leaves no progress thread logging behind
    except (ReplayConfigError, PulsarConfigError):
        created.remove_if_refused(state)
        raise


def _check_before_writing(
    storage: RunStorage,
    paths: RunPaths,
    options: ReplayOptions,
    conf: PulsarConf,
    resumed: bool,
    broker: bool,
) -> None:
    """The checks that need the broker or an earlier run's files, before any file or lock is created:
    the broker answers and accepts the credentials, the DLQ topics exist
    (:func:`~spark_apps.dlq_replay.broker_checks.check_broker`), and ``--window-from`` names a plan of
    the same topics and subscription."""
    from spark_apps.dlq_replay.broker_checks import check_broker

    if broker:
        check_broker(conf, options.topics)
    if options.window_from and not resumed:
        from spark_apps.dlq_replay.group_actions import reuse_window

        earlier = RunPaths(options.output_dir, options.window_from).plan
        reuse_window(storage, earlier, options.window_from, options.topics, options.subscription)


class _Created:
    """What a refused first attempt created under the output root, so that exit code 2 leaves nothing:
    the parts that did not exist before it started and are removed when it is refused."""

    def __init__(self, storage: RunStorage, paths: RunPaths) -> None:
        self.storage = storage
        self.paths = paths
        self.parts = [
            path
            for path in (paths.run, join(paths.root, "locks"), join(paths.root, "runs"), paths.root)
            if not storage.exists(path)
        ]

    def remove_if_refused(self, state: RunState) -> None:
        """Remove the run directory if this attempt created it, then the other parts if left empty."""
        if state.attempts > 1 or not self.parts:  # an earlier attempt's files stay
            return
        for path in self.parts:
            try:
                if path == self.paths.run or not self.storage.list_names(path):
                    self.storage.delete(path)
            except Exception as exc:  # the refusal matters more than the clean-up
                log.warning("could not remove %s after the refusal: %s", path, type(exc).__name__)


def _run_steps(run: _Run) -> dict[str, Any]:
    from spark_apps.dlq_replay.apply import dry_run_outcomes
    from spark_apps.dlq_replay.ledger import read_ledger, run_outcomes

    options = run.options
    started_wall = datetime.now(UTC)
    log.info(
        "run %s (%s, attempt %d): topics=%s output=%s",
        options.run_id,
        options.mode,
        run.state.attempts,
        ",".join(options.topics),
        run.paths.run,
    )
    if run.state.is_complete("report"):
        text = run.storage.read_text(run.paths.report_json)
        if text:
            log.info("run %s is already complete; nothing to do", options.run_id)
            report: dict[str, Any] = json.loads(text)
            return report
    windows, planned_at = _plan(run)
    if nothing_to_read(windows) and not any(s in run.state.steps for s in _MESSAGE_STEPS):
        _skip_message_steps(run, windows)
        return _report(run, None, started_wall)
    snapshot = _snapshot(run, windows)
    decisions = _decide(run, snapshot, planned_at)
    outcomes_df = dry_run_outcomes(decisions)
    if options.mode != oc.DRY_RUN:
        _apply(run, decisions, planned_at)
        _record(run)
        _commit(run, windows)
        # The ledger holds this run's outcomes (none for an empty window): the report reads them back.
        ledger = read_ledger(run.spark, run.storage, run.paths.ledger)
        if ledger is not None:
            outcomes_df = run_outcomes(ledger, options.run_id)
    return _report(run, outcomes_df, started_wall)


#: The steps that read, decide, send, record or ack messages (skipped whole for an empty window).
_MESSAGE_STEPS = ("snapshot", "decide", "apply", "record", "commit")


def nothing_to_read(windows: list[PartitionWindow]) -> bool:
    """True when the frozen window holds no message to read: every partition was empty when frozen, or
    (reader mode) had no pending entry. Then the run has nothing to decide, send, record or ack."""
    from spark_apps.dlq_replay.pulsar_io.window import READER_MODE

    return all(
        w.end_message_id is None or (w.read_mode == READER_MODE and w.pending_entries == 0) for w in windows
    )


def _skip_message_steps(run: _Run, windows: list[PartitionWindow]) -> None:
    """The empty-DLQ fast path: record the message steps complete with zero counts, without a Spark job
    (no Python worker starts, nothing is read or written); the report then has no outcome to aggregate."""
    from spark_apps.dlq_replay.pulsar_io.window import read_mode_of

    mode = read_mode_of(windows)
    zero: dict[str, dict[str, Any]] = {
        "snapshot": {"messages": 0, "dlq_reads": 0, "read_mode": mode, "empty_window": True},
        "decide": {"to_republish": 0, "max_sequence_id": -1, "producers_per_target": run.buckets},
        "apply": {"published": 0, "publish_failed": 0, "resent": 0, "resent_held": 0, "resend_bound": 0},
        "record": {},
        "commit": {
            "read_mode": mode,
            "acked": 0,
            "left_pending_seen": 0,
            "beyond_window": 0,
            "unacked_final": 0,
            "final_in_partial_entries": 0,
            "entries_acked": 0,
            "dlq_reads_snapshot": 0,
            "dlq_reads_commit": 0,
            "reads_per_message": 0.0,
        },
    }
    steps = ("snapshot", "decide") if run.options.mode == oc.DRY_RUN else _MESSAGE_STEPS
    for name in steps:
        if run.step(name):
            run.done(name, time.monotonic(), **zero[name])
    log.info("the window is empty: nothing to read, decide, send, record or ack")


def _recorded_at(run: _Run) -> datetime | None:
    """When this run's record step wrote its ledger rows (``None`` before it, or in a dry-run)."""
    value = run.state.info("record").get("recorded_at")
    return datetime.fromisoformat(str(value)) if value else None


def _report_parts(run: _Run) -> ReportParts | None:
    """The record tasks' report parts (:mod:`~spark_apps.dlq_replay.report_parts`); ``None`` for a run
    without a record step (a dry run: the report aggregates its decisions with Spark)."""
    if "record" not in run.state.steps:
        return None
    from spark_apps.dlq_replay.report_parts import read_parts

    return read_parts(run.paths.report_parts)


def _report(run: _Run, outcomes_df: DataFrame | None, started_wall: datetime) -> dict[str, Any]:
    from spark_apps.dlq_replay.report import CommitTotals, build_report
    from spark_apps.dlq_replay.report_details import ReportContext
    from spark_apps.dlq_replay.report_html import render_html

    options = run.options
    playbook = run.playbook
    started = time.monotonic()
    run.step("report")
    commit_info = run.state.info("commit")
    snapshot_reads = int(run.state.info("snapshot").get("dlq_reads", 0))
    failed = int(run.state.info("apply").get("publish_failed", 0))
    parts = _report_parts(run)
    report = build_report(
        outcomes_df,
        run_id=options.run_id,
        mode=options.mode,
        status="partial" if failed or int(commit_info.get("unacked_final", 0)) else "succeeded",
        started_at=run.state.started_at,
        finished_at=datetime.now(UTC).isoformat(timespec="milliseconds"),
        commit=CommitTotals(
            acked=int(commit_info.get("acked", 0)),
            left_pending_seen=int(commit_info.get("left_pending_seen", 0)),
            beyond_window=int(commit_info.get("beyond_window", 0)),
            unacked_final=int(commit_info.get("unacked_final", 0)),
            final_in_partial_entries=int(commit_info.get("final_in_partial_entries", 0)),
            read_mode=str(run.state.info("plan").get("read_mode", "consumer")),
            reads_per_message=float(commit_info.get("reads_per_message", 1.0 if snapshot_reads else 0.0)),
        ),
        timings=dict(run.state.timings),
        paths=run.paths.public(),
        resend={
            key: int(run.state.info("apply").get(key, 0)) for key in ("resent", "resent_held", "resend_bound")
        },
        context=ReportContext(
            options,
            playbook,
            run.paths.decisions,
            run.paths.snapshot,
            run.paths.ledger,
            recorded_at=_recorded_at(run),
        ),
        parts=parts,
        canary=(
            {"size": options.canary.label, **(run.state.info("apply").get("canary") or {})}
            if options.canary
            else None
        ),
    )
    report["timings"]["report"] = round(time.monotonic() - started, 3)  # the aggregation included
    run.storage.write_text(run.paths.report_json, json.dumps(report, indent=2, sort_keys=True))
    run.storage.write_text(run.paths.report_html, render_html(report))
    run.done("report", started, status=report["status"])
    log.info(
        "run %s %s in %.1fs: %s",
        options.run_id,
        report["status"],
        (datetime.now(UTC) - started_wall).total_seconds(),
        " ".join(f"{k}={v}" for k, v in report["totals"].items()),
    )
    return report
