"""Plan step: freeze the window of messages the run acts on and write it to ``runs/<run>/plan.json``
(``--window-from``: the window a reviewer approved, ``docs/approval.md``)."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from spark_apps.dlq_replay.errors import RunStateError
from spark_apps.dlq_replay.group_actions import reuse_window
from spark_apps.dlq_replay.ledger import read_ledger, settled_ends
from spark_apps.dlq_replay.pulsar_io.window import (
    CONSUMER_MODE,
    FrozenWindows,
    freeze,
    windows_from_json,
    windows_to_json,
)
from spark_apps.dlq_replay.run_context import RunPaths, RunState

if TYPE_CHECKING:
    from spark_apps.dlq_replay.pulsar_io.window import PartitionWindow
    from spark_apps.dlq_replay.run_context import Run

log = logging.getLogger("spark_apps.dlq_replay")


def run_plan(run: Run) -> tuple[list[PartitionWindow], datetime]:
    """Freeze (or reuse) the window once; the windows and plan time of the run."""
    opts = run.options
    if run.step("plan"):
        started = time.monotonic()
        if opts.window_from:  # the window a reviewer saw (docs/approval.md)
            frozen = FrozenWindows(reuse_window(opts), f"the window of the reviewed run {opts.window_from}")
        else:
            frozen = freeze(run.conf, list(opts.topics), opts.subscription)
        windows, settled = _settle_windows(run, frozen)
        planned_at = datetime.now(UTC)
        plan = {
            "run_id": opts.run_id,
            "mode": opts.mode,
            "planned_at": planned_at.isoformat(timespec="milliseconds"),
            "topics": list(opts.topics),
            "subscription": opts.subscription,
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
        raise RunStateError(
            f"{run.paths.plan} is missing although the plan step is complete; use a new --run-id"
        )
    plan = json.loads(text)
    return windows_from_json(plan["window"]), datetime.fromisoformat(plan["planned_at"])


def _settle_windows(run: Run, frozen: FrozenWindows) -> tuple[list[PartitionWindow], list[dict[str, Any]]]:
    """End the partitions :func:`~spark_apps.dlq_replay.ledger.settled_ends` names at their settled ends
    (consumer mode only: the reader mode reads only pending entries; a reviewed window is kept as is)."""
    settle = frozen.read_mode == CONSUMER_MODE and not run.options.window_from
    ledger = read_ledger(run.spark, run.storage, run.paths.ledger) if settle else None
    if ledger is None:
        return frozen.windows, []

    def commit_done(run_id: str) -> bool:
        path = RunPaths(run.options.output_dir, run_id).state
        text = run.storage.read_text(path)
        if not text:
            return False
        state = RunState.from_json(text, where=path)
        return state.is_complete("commit") and not int(state.info("commit").get("unacked_final", 0))

    ends = {e.topic: e for e in settled_ends(ledger, frozen.windows, commit_done)}
    for end in ends.values():
        log.info(
            "plan: the last message of %s is final in run(s) %s; reading it up to %s",
            end.topic,
            ", ".join(end.settled_by),
            end.end_message_id or "nothing (no message left pending there)",
        )
    windows = [
        replace(w, end_message_id=ends[w.topic].end_message_id) if w.topic in ends else w
        for w in frozen.windows
    ]
    return windows, [asdict(e) for e in ends.values()]
