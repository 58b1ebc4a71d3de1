"""``DlqBacklogRearmOperator``: after a successful replay, let the DLQ backlog watch fire again."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset, BaseOperator

from airflow_provider_dlq.triggers.backlog_event import STATE_KEY, WatchState, iso, rearmed

if TYPE_CHECKING:
    from collections.abc import Sequence

    from airflow.sdk import Context


def left_pending(summary: Any) -> int:
    """Messages of the replay's window it left pending (``totals.left_pending`` of its summary)."""
    if isinstance(summary, str):
        summary = json.loads(summary) if summary.strip() else None
    totals = summary.get("totals") if isinstance(summary, dict) else None
    if not isinstance(totals, dict) or "left_pending" not in totals:
        raise ValueError(
            "replay_summary must be the DlqReplayOperator's summary (its XCom, e.g. replay.output) with "
            f"totals.left_pending; got {type(summary).__name__}."
        )
    return int(totals["left_pending"])


class DlqBacklogRearmOperator(BaseOperator):
    """After the replay, re-arm ``asset``'s backlog watch with what the replay left pending as the baseline.

    :param asset: The watched asset (the DAG's schedule); it becomes this task's inlet.
    :param replay_summary: The ``DlqReplayOperator``'s summary (its XCom, e.g. ``replay.output``). (templated)

    .. seealso:: ``docs/event-driven.md``
    """

    template_fields: Sequence[str] = ("replay_summary",)
    ui_color = "#e8f4e8"

    def __init__(self, *, asset: Asset, replay_summary: Any, **kwargs: Any) -> None:
        if not isinstance(asset, Asset):
            raise TypeError(f"asset must be the watched airflow.sdk.Asset; got {type(asset).__name__}.")
        kwargs.setdefault("inlets", [asset])
        super().__init__(**kwargs)
        self.asset = asset
        self.replay_summary = replay_summary

    def execute(self, context: Context) -> dict[str, Any]:
        baseline = left_pending(self.replay_summary)
        store = context["asset_state_store"][self.asset]
        before = WatchState.from_json(store.get(STATE_KEY))
        ti = context["ti"]
        state = rearmed(before, baseline, by=f"{ti.dag_id}/{ti.run_id}", now=time.time())
        store.set(STATE_KEY, asdict(state))
        self.log.info(
            "Re-armed the backlog watch of asset %r (it fired %d times, last at %s); baseline %d "
            "messages left pending by the replay",
            self.asset.name,
            state.fires,
            iso(state.fired_at),
            baseline,
        )
        return asdict(state)
