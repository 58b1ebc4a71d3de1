"""The operator's arguments as the app's ``ReplayOptions`` (checked before Spark starts); the run summary."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from airflow_provider_dlq.errors import DlqProviderError
from airflow_provider_dlq.hooks.backlog import split_topics
from pulsar_dlq_consumer.errors import ConfigurationError
from pulsar_dlq_consumer.replay_options import (
    BOOLEAN_WORDS,
    FLAGS,
    GROUP_ACTIONS,
    TOPICS_REQUIRED,
    Flag,
    ReplayOptions,
    ReplayOptionsError,
)

_SAFE_RUN_ID = re.compile(r"[A-Za-z0-9._-]{1,120}")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
#: Where a DAG of the examples takes a value the app says is missing (added to the app's message).
_WHERE_TO_SET = {
    "--topics is required": (
        "Set Variable dlq_topics (Admin > Variables; comma-separated, e.g. "
        "persistent://public/default/orders-DLQ), which the example DAGs read when the run's Param topics "
        "(the trigger form's 'DLQ topics') is empty, or give the operator's topics."
    ),
    "--origin-allowlist is required": (
        "Set Variable dlq_origin_allowlist, or the run's Param origin_allowlist in dlq_backfill."
    ),
}


class ReplayArgumentError(DlqProviderError, ValueError):
    """An argument of ``DlqReplayOperator`` is invalid; the message names it, the value and the fix."""


def default_run_id(dag_id: str, task_id: str, run_id: str, map_index: int | None = -1) -> str:
    """``dag_id.task_id.run_id[.map_index]``, made safe, at most 120 characters: a retry resumes it."""
    raw = f"{dag_id}.{task_id}.{run_id}" + ("" if map_index in (None, -1) else f".{map_index}")
    safe = _UNSAFE.sub("_", raw).strip("._-") or "run"
    if len(safe) > 120:
        safe = f"{safe[:103]}-{hashlib.sha256(raw.encode()).hexdigest()[:16]}"
    return safe


def report_json(options: ReplayOptions) -> str:
    return f"{options.output_dir}/runs/{options.run_id}/report.json"


def as_list(name: str, value: str | Sequence[str] | None) -> list[str]:
    """A list of strings from a list or a comma-separated string."""
    if value is not None and not isinstance(value, str | Sequence):
        raise ReplayArgumentError(f"{name} must be a list or a comma-separated string; got {value!r}.")
    return split_topics(value or [])


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip() in ("", "None", "null"))


def _flag_value(flag: Flag, value: Any) -> Any:
    """A rendered value as the app's parsed argument of ``flag`` (``None``: not given)."""
    if _blank(value):
        return None
    if flag.kind == "list":
        return ",".join(as_list(flag.name, value)) or None
    if isinstance(value, datetime):
        return value.isoformat()
    number = flag.argparse_kwargs()["type"]
    if number is None:
        return str(value).strip()
    try:
        if isinstance(value, bool):
            raise ValueError(value)
        return number(str(value).strip())
    except ValueError:
        message = f"{flag.name} must be a number ({number.__name__}); got {value!r}."
        raise ReplayArgumentError(message) from None


def archive_flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    try:
        return BOOLEAN_WORDS[str(value).strip().lower()]
    except KeyError:
        raise ReplayArgumentError(f"archive_payload must be on/off (or a bool); got {value!r}.") from None


def parse_group_actions(value: Any) -> dict[str, str] | None:
    """``{signature: action}`` from a mapping or its JSON text; blank -> ``None``."""
    if _blank(value):
        return None
    data = value
    if isinstance(value, str):
        try:
            data = json.loads(value)
        except ValueError:
            data = None
    if not isinstance(data, Mapping):
        raise ReplayArgumentError(
            f"group_actions must be a mapping (or its JSON) of error signature to one of "
            f"{', '.join(GROUP_ACTIONS)}; got {value!r}."
        )
    return {str(k): str(v) for k, v in sorted(data.items())}


def _signatures(values: Mapping[str, Any], actions: dict[str, str] | None) -> tuple[str, ...]:
    """The signatures to act on; with an approval and none given, the approved groups only."""
    signatures = tuple(as_list("signatures", values.get("signatures")))
    if actions is None or signatures:
        return signatures
    signatures = tuple(sig for sig, action in actions.items() if action != "leave")
    if not signatures:
        raise ReplayArgumentError(
            "group_actions approves no group (every action is 'leave'); there is nothing to replay."
        )
    return signatures


def _output_dir(value: Any) -> str:
    """Local relative paths become absolute (the driver, executors and this task must agree)."""
    text = "" if _blank(value) else str(value).strip()
    return text.rstrip("/") if "://" in text else os.path.abspath(text) if text else ""


def check_topics(topics: str | Sequence[str] | None) -> None:
    """Refuse a run without DLQ topics before anything else is looked up, saying where to set them."""
    if not as_list("topics", topics):
        raise _hinted(ReplayOptionsError(TOPICS_REQUIRED))


def _hinted(exc: ConfigurationError) -> ReplayArgumentError:
    hint = next((h for start, h in _WHERE_TO_SET.items() if str(exc).startswith(start)), None)
    return ReplayArgumentError(f"{exc}. {hint}" if hint else f"{exc}.")


def build_replay_args(values: Mapping[str, Any]) -> ReplayOptions:
    """The operator's rendered values as the app's options, or :class:`ReplayArgumentError`."""
    actions = parse_group_actions(values.get("group_actions"))
    parsed = {flag.name: _flag_value(flag, values.get(flag.name)) for flag in FLAGS}
    parsed["archive_payload"] = "on" if archive_flag(values.get("archive_payload", "on")) else "off"
    run_id = str(values["run_id"])
    if not _SAFE_RUN_ID.fullmatch(run_id) or run_id in (".", ".."):
        raise ReplayArgumentError(
            f"run_id must be 1-120 characters of [A-Za-z0-9._-] (it names runs/<run_id>/); got {run_id!r}. "
            "Leave it unset to derive it from the DAG run."
        )
    try:
        return ReplayOptions.from_arguments(
            parsed,
            run_id=run_id,
            service_url=str(values["service_url"]),
            topics=tuple(as_list("topics", values.get("topics"))),
            output_dir=_output_dir(values.get("output_dir")),
            signatures=_signatures(values, actions) or None,
            group_actions=actions,
        )
    except ConfigurationError as exc:  # the options' checks (ReplayOptionsError)
        raise _hinted(exc) from None


def compact_summary(report: Mapping[str, Any], max_groups: int = 20) -> dict[str, Any]:
    """The XCom/asset-event summary of a report: run, mode, status, totals, paths and the top groups."""
    keys = ("signature", "count", "error_class", "origin_topic", "action")
    groups = [
        {
            **{k: g.get(k) for k in keys},
            "template": str(g.get("template") or "")[:160],
            "outcomes": g.get("outcomes", {}),
        }
        for g in (report.get("groups") or [])[:max_groups]
    ]
    total_groups = len(report.get("groups") or []) + int((report.get("other_groups") or {}).get("groups", 0))
    summary = {
        "run_id": report.get("run_id"),
        "mode": report.get("mode"),
        "status": report.get("status"),
        "totals": dict(report.get("totals") or {}),
        "paths": dict(report.get("paths") or {}),
        "group_count": total_groups,
        "groups": groups,
    }
    if report.get("spark"):
        summary["spark"] = dict(report["spark"])
    if canary := report.get("canary"):
        keys = ("size", "verdict", "halted", "held_back", "verdicts")
        summary["canary"] = {k: canary[k] for k in keys if k in canary}
    return summary
