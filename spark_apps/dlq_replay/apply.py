"""Apply step: archive, then republish the decisions in waves, each saved before the next starts, so a
killed run re-sends at most one wave per producer."""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import TYPE_CHECKING

import pyarrow.compute as pc
from pyspark.sql import functions as F

from pulsar_dlq_consumer.replay_options import DEDUP_WAVE_SIZE, DEFAULT_WAVE_SIZE
from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay.archive_files import publish_staged
from spark_apps.dlq_replay.canary import run_canary, unsent_halted
from spark_apps.dlq_replay.pulsar_io.dedup import deduplication
from spark_apps.dlq_replay.schemas import RESULTS_SCHEMA
from spark_apps.dlq_replay.storage import join, read_table
from spark_apps.dlq_replay.task_parquet import data_files, read_frame
from spark_apps.dlq_replay.task_sends import SendFilter, send_wave, sending_targets

if TYPE_CHECKING:
    from datetime import datetime

    from pyspark.sql import DataFrame

    from spark_apps.dlq_replay.run_context import Run

log = logging.getLogger("spark_apps.dlq_replay")


def run_apply(run: Run, decisions: DataFrame, planned_at: datetime) -> None:
    """Move the staged archive into place, then send the decisions in waves (a canary first, when asked)."""
    to_send = int(run.state.info("decide").get("to_republish", 0))
    if run.step("apply"):
        started = time.monotonic()
        progress = run.state.progress("apply")
        if not progress.get("archive_written"):
            date = planned_at.strftime("%Y-%m-%d")
            publish_staged(run.paths.archive_staged, run.paths.archive, date, run.options.run_id)
            progress["archive_written"] = True
            run.save()
        published = failed = 0
        if to_send:
            around: SendFilter | None = None
            unsent = 0
            if run.options.canary:  # canary first; halted groups are not sent (docs/canary.md)
                every_id = (0, int(run.state.info("decide").get("max_sequence_id", -1)) + 1)
                halted = run_canary(run, decisions, partial(_send_wave, run, every_id))
                around = SendFilter(run.paths.canary_ids, canary=False, halted=tuple(halted))
                unsent = unsent_halted(run, decisions, halted)
            _republish_in_waves(run, decisions, to_send, around)
            files = data_files(run.paths.republish_results)  # one boolean column of each, read in the driver
            published = sum(int(pc.sum(read_table(f, ["published"]).column(0)).as_py() or 0) for f in files)
            failed = to_send - published - unsent
            if failed:
                log.warning("step apply: %d messages could not be published; they stay pending", failed)
        resends = {key: int(progress.get(key, 0)) for key in ("resent", "resent_held", "resend_bound")}
        run.done("apply", started, published=published, publish_failed=failed, **resends)


def _send_wave(run: Run, sequence_range: tuple[int, int], path: str, chosen: SendFilter | None) -> None:
    send_wave(
        run.spark,
        run.paths.decisions,
        int(run.state.info("decide").get("producers_per_target") or run.buckets),
        sequence_range,
        run.conf,
        path,
        batch_rows=run.batch_rows,
        rate_limit_per_s=run.options.rate_limit,
        only=chosen,
    )


def _republish_in_waves(run: Run, decisions: DataFrame, to_send: int, around: SendFilter | None) -> None:
    """Send the waves of ``--wave-size`` sequence ids per producer not saved yet (``around`` a canary)."""
    progress = run.state.progress("apply")
    last = int(run.state.info("decide").get("max_sequence_id", -1))
    if not progress.get("wave_size"):
        progress["wave_size"] = _wave_size(run, last)
        run.save()
    size = int(progress["wave_size"])
    waves = last // size + 1
    for wave in range(waves):
        run.lock.check()
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
        sequence_ids = (wave * size, (wave + 1) * size)
        _send_wave(run, sequence_ids, path, around)
        if again:
            _count_resend(run, decisions, path, sequence_ids, int(progress["wave_starts"]) - 1)
        progress["waves_done"] = wave + 1
        progress.pop("wave_in_flight", None)
        progress.pop("wave_starts", None)
        run.save()


def _count_resend(
    run: Run, decisions: DataFrame, results: str, sequence_range: tuple[int, int], restarts: int
) -> None:
    """Add a wave ``restarts`` killed attempts had started to the resend counts (``docs/reliability.md``)."""
    lo, hi = sequence_range
    held = F.count_if(F.col("published_message_id").startswith("-1:"))
    sent, dropped = read_frame(run.spark, results, RESULTS_SCHEMA).agg(F.count(F.lit(1)), held).collect()[0]
    in_wave = (F.col("outcome") == oc.TO_REPUBLISH) & F.col("sequence_id").between(lo, hi - 1)
    producers = decisions.filter(in_wave).agg(F.count_distinct("replay_producer")).collect()[0][0]
    progress = run.state.progress("apply")
    added = {
        "resent": restarts * sent,
        "resent_held": dropped,
        "resend_bound": restarts * (hi - lo) * producers,
    }
    for key, n in added.items():
        progress[key] = int(progress.get(key, 0)) + int(n)


def _wave_size(run: Run, last: int) -> int:
    """``--wave-size``, else the wave size for the target topics' deduplication (``docs/reliability.md``)."""
    if run.options.wave_size is not None:
        return run.options.wave_size
    if last < DEFAULT_WAVE_SIZE:
        return DEFAULT_WAVE_SIZE  # one wave either way: no need to ask the broker
    dedup = deduplication(run.conf, sending_targets(run.spark, run.paths.decisions))
    size = DEDUP_WAVE_SIZE if dedup.on else DEFAULT_WAVE_SIZE
    log.info("step apply: waves of %d sequence ids per producer (%s)", size, dedup.reason)
    return size
