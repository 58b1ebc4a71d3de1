"""Pure helpers of ``DlqReplayOperator``: validate rendered arguments and build the app's command line.

The command line is the contract of ``spark_apps/dlq_replay_main.py`` (its ``--help`` documents every
option). Secrets never appear here: the app reads the token from ``PULSAR_AUTH_TOKEN`` (or the file of
``--auth-token-file``) and OAuth2 client credentials from ``PULSAR_OAUTH2_CREDENTIALS`` (or the file of
``--oauth2-credentials-file``); certificates and keys are passed as file paths.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from airflow_provider_dlq.errors import DlqProviderError

MODES = ("dry-run", "replay", "archive-only")
DEFAULT_SUBSCRIPTION = "dlq-replayer"
DEFAULT_MAX_REPLAYS = 3
SUMMARY_PREFIX = "DLQ_REPLAY_SUMMARY "
_SAFE_RUN_ID = re.compile(r"[A-Za-z0-9._-]{1,120}")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class ReplayArgumentError(DlqProviderError, ValueError):
    """An argument of ``DlqReplayOperator`` is invalid; the message names it, the value and the fix."""


def default_run_id(dag_id: str, task_id: str, run_id: str, map_index: int = -1) -> str:
    """A replay run id derived from the Airflow task's DAG run: the same on every try, so a retry resumes.

    ``dag_id.task_id.run_id`` (plus ``.map_index`` for mapped tasks) with every character outside
    ``[A-Za-z0-9._-]`` replaced by ``_``; longer than 120 characters it is cut and a hash keeps it unique.
    """
    raw = f"{dag_id}.{task_id}.{run_id}" + (f".{map_index}" if map_index >= 0 else "")
    safe = _UNSAFE.sub("_", raw).strip("._-") or "run"
    if len(safe) > 120:
        safe = f"{safe[:103]}-{hashlib.sha256(raw.encode()).hexdigest()[:16]}"
    return safe


def check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not _SAFE_RUN_ID.fullmatch(run_id) or run_id in (".", ".."):
        raise ReplayArgumentError(
            f"run_id must be 1-120 characters of [A-Za-z0-9._-] (it names runs/<run_id>/); got {run_id!r}. "
            "Leave it unset to derive it from the DAG run."
        )
    return run_id


def as_list(name: str, value: str | Sequence[str] | None) -> list[str]:
    """A list of strings from a list or a comma-separated string (the shape templates render)."""
    if value is None:
        return []
    if isinstance(value, str):
        items = value.split(",")
    elif isinstance(value, Sequence):
        items = [str(v) for v in value]
    else:
        raise ReplayArgumentError(f"{name} must be a list or a comma-separated string; got {value!r}.")
    return [item.strip() for item in items if item.strip()]


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip() in ("", "None", "null"))


def opt_int(name: str, value: Any, minimum: int = 0) -> int | None:
    """``None``/blank -> ``None``; an int or integer string >= minimum; else a clear error."""
    if _blank(value):
        return None
    try:
        if isinstance(value, bool):
            raise ValueError(value)
        number = int(str(value).strip())
    except ValueError:
        raise ReplayArgumentError(f"{name} must be an integer >= {minimum}; got {value!r}.") from None
    if number < minimum:
        raise ReplayArgumentError(f"{name} must be an integer >= {minimum}; got {value!r}.")
    return number


def opt_float(name: str, value: Any) -> float | None:
    if _blank(value):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = -1.0
    if isinstance(value, bool) or number <= 0:
        raise ReplayArgumentError(f"{name} must be a positive number; got {value!r}.")
    return number


def opt_time(name: str, value: Any) -> str | None:
    """ISO 8601 date or date-time (a ``datetime`` is formatted); checked here so typos fail before Spark."""
    if _blank(value):
        return None
    if isinstance(value, datetime):
        return value.isoformat()
    text = str(value).strip()
    try:
        datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ReplayArgumentError(
            f"{name} must be ISO 8601, e.g. 2024-05-01 or 2024-05-01T12:00:00+00:00; got {value!r}."
        ) from exc
    return text


def _utc(text: str) -> datetime:
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def opt_str(value: Any) -> str | None:
    return None if _blank(value) else str(value).strip()


def archive_flag(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    text = str(value).strip().lower()
    if text in ("on", "true", "1", "yes"):
        return "on"
    if text in ("off", "false", "0", "no"):
        return "off"
    raise ReplayArgumentError(f"archive_payload must be on/off (or a bool); got {value!r}.")


def qualify_output_dir(output_dir: Any) -> str:
    """Local relative paths become absolute (the driver, executors and this task must agree)."""
    text = opt_str(output_dir)
    if not text:
        raise ReplayArgumentError(
            "output_dir is required: the root of runs/, archive/ and ledger/ (a local path, file:// or a "
            "Hadoop URI such as s3a://bucket/dlq)."
        )
    if "://" in text:
        return text.rstrip("/")
    return os.path.abspath(text)


@dataclass(frozen=True)
class ReplayArgs:
    """The validated, rendered arguments of one replay run."""

    run_id: str
    mode: str
    service_url: str
    topics: tuple[str, ...]
    output_dir: str
    subscription: str = DEFAULT_SUBSCRIPTION
    auth_token_file: str | None = None
    tls_trust_certs_file: str | None = None
    admin_url: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    oauth2_issuer_url: str | None = None
    oauth2_audience: str | None = None
    oauth2_scope: str | None = None
    oauth2_credentials_file: str | None = None
    playbook: str | None = None
    origin_allowlist: tuple[str, ...] = ()
    signatures: tuple[str, ...] = ()
    error_class: str | None = None
    since: str | None = None
    until: str | None = None
    max_messages: int | None = None
    max_replays: int = DEFAULT_MAX_REPLAYS
    rate_limit: float | None = None
    parallelism: int | None = None
    archive_payload: str = "on"
    group_actions: tuple[tuple[str, str], ...] | None = None
    window_from: str | None = None
    canary: str | None = None
    canary_wait_seconds: float | None = None
    canary_max_failure_rate: float | None = None

    @property
    def report_json(self) -> str:
        """Where the app writes its report (``<output-dir>/runs/<run_id>/report.json``)."""
        return f"{self.output_dir}/runs/{self.run_id}/report.json"

    def to_argv(self) -> list[str]:
        """The app's arguments, in a stable order (see the app's ``--help``)."""
        argv = [
            "--run-id", self.run_id,
            "--mode", self.mode,
            "--service-url", self.service_url,
            "--topics", ",".join(self.topics),
            "--subscription", self.subscription,
            "--output-dir", self.output_dir,
        ]  # fmt: skip
        optional: list[tuple[str, Any]] = [
            ("--auth-token-file", self.auth_token_file),
            ("--tls-trust-certs-file", self.tls_trust_certs_file),
            ("--admin-url", self.admin_url),
            ("--tls-cert-file", self.tls_cert_file),
            ("--tls-key-file", self.tls_key_file),
            ("--oauth2-issuer-url", self.oauth2_issuer_url),
            ("--oauth2-audience", self.oauth2_audience),
            ("--oauth2-scope", self.oauth2_scope),
            ("--oauth2-credentials-file", self.oauth2_credentials_file),
            ("--playbook", self.playbook),
            ("--origin-allowlist", ",".join(self.origin_allowlist)),
            ("--signatures", ",".join(self.signatures)),
            ("--error-class", self.error_class),
            ("--since", self.since),
            ("--until", self.until),
            ("--max-messages", self.max_messages),
            ("--max-replays", self.max_replays),
            ("--rate-limit", self.rate_limit),
            ("--parallelism", self.parallelism),
            ("--archive-payload", self.archive_payload),
            ("--group-actions", group_actions_json(self.group_actions)),
            ("--window-from", self.window_from),
            ("--canary", self.canary),
            ("--canary-wait-seconds", self.canary_wait_seconds),
            ("--canary-max-failure-rate", self.canary_max_failure_rate),
        ]
        for flag, value in optional:
            if value is not None and value != "":
                argv += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
        return argv


GROUP_ACTIONS = ("replay", "archive", "leave")


def parse_group_actions(value: Any) -> tuple[tuple[str, str], ...] | None:
    """``{signature: replay|archive|leave}`` (a mapping or its JSON text, as templates render it) as
    sorted pairs; ``None``/blank -> ``None``. The app's ``--group-actions`` (docs/approval.md)."""
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
    bad = {str(k): v for k, v in data.items() if v not in GROUP_ACTIONS}
    if bad:
        raise ReplayArgumentError(f"group_actions: {bad} must each be one of {', '.join(GROUP_ACTIONS)}.")
    return tuple(sorted((str(k), str(v)) for k, v in data.items()))


def group_actions_json(pairs: tuple[tuple[str, str], ...] | None) -> str | None:
    return None if pairs is None else json.dumps(dict(pairs), sort_keys=True, separators=(",", ":"))


_CANARY_SIZE = re.compile(r"[0-9]+(\.[0-9]+)?%|[1-9][0-9]*")


def canary_args(values: Mapping[str, Any]) -> dict[str, Any]:
    """``canary`` (N or P%), its wait and its halt threshold, validated (docs/canary.md)."""
    size = opt_str(values.get("canary"))
    if size is None:
        return {}
    if not _CANARY_SIZE.fullmatch(size):
        raise ReplayArgumentError(
            f"canary must be a count such as 5 or a percentage such as 10%; got {size!r}."
        )
    wait: Any = values.get("canary_wait_seconds")
    rate: Any = values.get("canary_max_failure_rate")
    try:
        wait_s = 60.0 if _blank(wait) else float(wait)
        max_rate = 0.0 if _blank(rate) else float(rate)
    except (TypeError, ValueError):
        raise ReplayArgumentError(
            f"canary_wait_seconds and canary_max_failure_rate must be numbers; got {wait!r}, {rate!r}."
        ) from None
    if wait_s < 0 or not 0 <= max_rate < 1:
        raise ReplayArgumentError(
            f"canary_wait_seconds must be >= 0 and canary_max_failure_rate in [0, 1); got {wait!r}, {rate!r}."
        )
    return {"canary": size, "canary_wait_seconds": wait_s, "canary_max_failure_rate": max_rate}


def build_replay_args(values: Mapping[str, Any]) -> ReplayArgs:
    """Validate the operator's rendered values and build :class:`ReplayArgs` (errors name the fix)."""
    mode = str(values.get("mode") or "dry-run").strip()
    if mode not in MODES:
        raise ReplayArgumentError(f"mode must be one of {', '.join(MODES)}; got {values.get('mode')!r}.")
    topics = tuple(as_list("topics", values.get("topics")))
    if not topics:
        raise ReplayArgumentError(
            f"topics is empty (got {values.get('topics')!r}): there is no DLQ topic to replay. Set Variable "
            "dlq_topics (Admin > Variables; comma-separated, e.g. persistent://public/default/orders-DLQ), "
            "which the example DAGs read when the run's Param topics (the trigger form's 'DLQ topics') is "
            "empty, or give the operator's topics."
        )
    allowlist = tuple(as_list("origin_allowlist", values.get("origin_allowlist")))
    if mode == "replay" and not allowlist:
        raise ReplayArgumentError(
            "mode='replay' republishes to origin topics taken from untrusted message properties, so it "
            "needs origin_allowlist (globs such as persistent://public/default/orders*, or re:<regex>): set "
            "Variable dlq_origin_allowlist, or the run's Param origin_allowlist in dlq_backfill."
        )
    subscription = opt_str(values.get("subscription")) or DEFAULT_SUBSCRIPTION
    since, until = opt_time("since", values.get("since")), opt_time("until", values.get("until"))
    if since and until and _utc(since) >= _utc(until):
        raise ReplayArgumentError(f"since ({since}) must be before until ({until}).")
    max_replays = opt_int("max_replays", values.get("max_replays"), minimum=1)
    group_actions = parse_group_actions(values.get("group_actions"))
    signatures = tuple(as_list("signatures", values.get("signatures")))
    if group_actions is not None and not signatures:
        # An approval acts on the approved groups only; never on everything for want of a filter.
        signatures = tuple(sig for sig, action in group_actions if action != "leave")
        if not signatures:
            raise ReplayArgumentError(
                "group_actions approves no group (every action is 'leave'); there is nothing to replay."
            )
    window_from = opt_str(values.get("window_from"))
    if window_from is not None:
        check_run_id(window_from)
    return ReplayArgs(
        run_id=check_run_id(str(values["run_id"])),
        mode=mode,
        service_url=str(values["service_url"]),
        topics=topics,
        output_dir=qualify_output_dir(values.get("output_dir")),
        subscription=subscription,
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
        origin_allowlist=allowlist,
        signatures=signatures,
        error_class=opt_str(values.get("error_class")),
        since=since,
        until=until,
        max_messages=opt_int("max_messages", values.get("max_messages"), minimum=1),
        max_replays=DEFAULT_MAX_REPLAYS if max_replays is None else max_replays,
        rate_limit=opt_float("rate_limit", values.get("rate_limit")),
        parallelism=opt_int("parallelism", values.get("parallelism"), minimum=1),
        archive_payload=archive_flag(values.get("archive_payload", "on")),
        group_actions=group_actions,
        window_from=window_from,
        **canary_args(values),
    )


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
