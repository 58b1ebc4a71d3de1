"""The operator's rendered arguments as the app's options (the library's ``ReplayOptions``, whose checks
run here too, so a bad argument fails the task before Spark starts), and the run's summary. Secrets never
appear here: the app reads them from its environment or from files.
"""

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
    DEFAULT_CANARY_WAIT_SECONDS,
    DEFAULT_MAX_REPLAYS,
    DEFAULT_SUBSCRIPTION,
    DRY_RUN,
    GROUP_ACTIONS,
    TOPICS_REQUIRED,
    CanarySpec,
    ReplayOptions,
    ReplayOptionsError,
    parse_time,
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


def default_run_id(dag_id: str, task_id: str, run_id: str, map_index: int = -1) -> str:
    """``dag_id.task_id.run_id[.map_index]``, made safe and at most 120 characters: the same on every try,
    so a retry resumes."""
    raw = f"{dag_id}.{task_id}.{run_id}" + (f".{map_index}" if map_index >= 0 else "")
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


def opt_str(value: Any) -> str | None:
    return None if _blank(value) else str(value).strip()


def opt_number(name: str, value: Any, kind: type[int] | type[float] = int) -> Any:
    """``None``/blank -> ``None``; else ``value`` as ``kind`` (the options check its range)."""
    if _blank(value):
        return None
    try:
        if isinstance(value, bool):
            raise ValueError(value)
        return kind(str(value).strip())
    except ValueError:
        raise ReplayArgumentError(f"{name} must be a number ({kind.__name__}); got {value!r}.") from None


def opt_time(name: str, value: Any) -> datetime | None:
    if _blank(value):
        return None
    return parse_time(value.isoformat() if isinstance(value, datetime) else str(value), name)


def archive_flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("on", "true", "1", "yes"):
        return True
    if text in ("off", "false", "0", "no"):
        return False
    raise ReplayArgumentError(f"archive_payload must be on/off (or a bool); got {value!r}.")


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


def _canary(values: Mapping[str, Any]) -> CanarySpec | None:
    size = opt_str(values.get("canary"))
    if size is None:
        return None
    wait = opt_number("canary_wait_seconds", values.get("canary_wait_seconds"), float)
    rate = opt_number("canary_max_failure_rate", values.get("canary_max_failure_rate"), float)
    return CanarySpec.parse(
        size, DEFAULT_CANARY_WAIT_SECONDS if wait is None else wait, 0.0 if rate is None else rate
    )


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


def _run_id(value: Any) -> str:
    run_id = str(value)
    if not _SAFE_RUN_ID.fullmatch(run_id) or run_id in (".", ".."):
        raise ReplayArgumentError(
            f"run_id must be 1-120 characters of [A-Za-z0-9._-] (it names runs/<run_id>/); got {run_id!r}. "
            "Leave it unset to derive it from the DAG run."
        )
    return run_id


def _output_dir(value: Any) -> str:
    """Local relative paths become absolute (the driver, executors and this task must agree)."""
    text = opt_str(value) or ""
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
    max_replays = opt_number("max_replays", values.get("max_replays"))
    try:
        return ReplayOptions(
            run_id=_run_id(values["run_id"]),
            mode=str(values.get("mode") or DRY_RUN).strip(),
            service_url=str(values["service_url"]),
            topics=tuple(as_list("topics", values.get("topics"))),
            output_dir=_output_dir(values.get("output_dir")),
            subscription=opt_str(values.get("subscription")) or DEFAULT_SUBSCRIPTION,
            auth_token_file=opt_str(values.get("auth_token_file")),
            tls_trust_certs_file=opt_str(values.get("tls_trust_certs_file")),
            admin_url=opt_str(values.get("admin_url")),
            tls_cert_file=opt_str(values.get("tls_cert_file")),
            tls_key_file=opt_str(values.get("tls_key_file")),
            oauth2_issuer_url=opt_str(values.get("oauth2_issuer_url")),
            oauth2_audience=opt_str(values.get("oauth2_audience")),
            oauth2_scope=opt_str(values.get("oauth2_scope")),
            oauth2_credentials_file=opt_str(values.get("oauth2_credentials_file")),
            playbook=opt_str(values.get("playbook")),
            origin_allowlist=tuple(as_list("origin_allowlist", values.get("origin_allowlist"))) or None,
            signatures=_signatures(values, actions) or None,
            error_class=opt_str(values.get("error_class")),
            since=opt_time("since", values.get("since")),
            until=opt_time("until", values.get("until")),
            max_messages=opt_number("max_messages", values.get("max_messages")),
            max_replays=DEFAULT_MAX_REPLAYS if max_replays is None else max_replays,
            rate_limit=opt_number("rate_limit", values.get("rate_limit"), float),
            parallelism=opt_number("parallelism", values.get("parallelism")),
            archive_payload=archive_flag(values.get("archive_payload", "on")),
            group_actions=actions,
            window_from=opt_str(values.get("window_from")),
            canary=_canary(values),
        )
    except ConfigurationError as exc:  # the options' checks (ReplayOptionsError)
        raise _hinted(exc) from None


def compact_summary(report: Mapping[str, Any], max_groups: int = 20) -> dict[str, Any]:
    """The XCom/asset-event summary of a report: run, mode, status, totals, paths and the top groups."""
    groups = [
        {
            "signature": g.get("signature"),
            "count": g.get("count"),
            "error_class": g.get("error_class"),
            "origin_topic": g.get("origin_topic"),
            "template": str(g.get("template") or "")[:160],
            "action": g.get("action"),
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
    canary = report.get("canary")
    if canary:
        keys = ("size", "verdict", "halted", "held_back", "verdicts")
        summary["canary"] = {k: canary[k] for k in keys if k in canary}
    return summary
