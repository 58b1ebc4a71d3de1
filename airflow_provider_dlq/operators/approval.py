"""``DlqGroupApprovalOperator``: a person chooses, per error group, what a replay may do (Airflow HITL)."""

from __future__ import annotations

import json
from contextlib import suppress
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.providers.common.compat.sdk import SkipMixin
from airflow.providers.standard.operators.hitl import HITLOperator
from airflow.sdk import Param
from airflow.sdk.definitions.param import ParamsDict

from airflow_provider_dlq.output_storage import split_location
from pulsar_dlq_consumer.replay_options import GROUP_ACTIONS

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from airflow.sdk import Context

REPLAY, ARCHIVE, LEAVE = GROUP_ACTIONS
#: What the playbook proposed for a group (the report's action), as a suggestion for the reviewer.
_SUGGESTION = {"republish": REPLAY, "archive": ARCHIVE, "drop": ARCHIVE, "skip": LEAVE}
_MARKDOWN_ESCAPES = str.maketrans({"`": "'", "<": "&lt;"} | {char: "\\" + char for char in "\\|[]*_"})


def load_groups(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The dry-run's groups from its ``report.json`` when readable here, else the summary's top groups."""
    scheme, path = split_location(str((summary.get("paths") or {}).get("report_json") or ""))
    if path and not scheme and Path(path).is_file():
        return list(json.loads(Path(path).read_text(encoding="utf-8")).get("groups") or [])
    return list(summary.get("groups") or [])


def _plain(value: Any, limit: int = 120) -> str:
    return " ".join(str(value if value is not None else "-").split())[:limit]


def _cell(value: Any) -> str:
    """Text safe inside a Markdown table cell (values come from DLQ messages: untrusted)."""
    return _plain(value).translate(_MARKDOWN_ESCAPES)


def proposal(group: Mapping[str, Any]) -> str:
    """The playbook's action for a group in the form's words."""
    return _SUGGESTION.get(str(group.get("action") or "skip"), LEAVE)


def fix_failures(group: Mapping[str, Any]) -> int:
    return int((group.get("outcomes") or {}).get("fix_failed", 0) or 0)


def approval_body(
    summary: Mapping[str, Any],
    groups: Sequence[Mapping[str, Any]],
    shown: int,
    report_link: str | None = None,
) -> str:
    """The Markdown above the form: the dry-run, its report link, and one table row per group."""
    totals = summary.get("totals") or {}
    lines = [
        f"Dry-run **{_cell(summary.get('run_id'))}** found **{totals.get('snapshot', 0)}** pending DLQ "
        f"messages in **{len(groups)}** error groups. Choose per group: **replay** (republish to its "
        "origin; the playbook's fix applies), **archive** (archive and ack) or **leave** (stays pending). "
        "Only the groups you approve are touched, and only the messages this dry-run saw.",
    ]
    if report_link:
        lines += ["", f"[Open the dry-run's report]({report_link}) (every group, its rules and next steps)."]
    lines += [
        "",
        # What to decide on first (the proposal and the fix failures): the rest may scroll off.
        "| # | signature | messages | error | template | playbook proposes | fix fails | origin | "
        "first / last seen | sample ids |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n, group in enumerate(groups[:shown], start=1):
        samples = ", ".join(str(s) for s in (group.get("sample_message_ids") or [])[:3])
        failing = fix_failures(group)
        lines.append(
            f"| {n} | `{_cell(group.get('signature'))}` | {int(group.get('count') or 0)} | "
            f"{_cell(group.get('error_class'))} | {_cell(group.get('template'))} | {proposal(group)} | "
            f"{f'**{failing}** (stay pending)' if failing else '0'} | {_cell(group.get('origin_topic'))} | "
            f"{_cell(group.get('first_seen'))} / {_cell(group.get('last_seen'))} | {_cell(samples)} |"
        )
    if len(groups) > shown:
        rest = sum(int(g.get("count") or 0) for g in groups[shown:])
        lines += ["", f"{len(groups) - shown} smaller groups ({rest} messages) are not shown, stay pending."]
    return "\n".join(lines)


def group_params(groups: Sequence[Mapping[str, Any]]) -> dict[str, Param]:
    """One form field per group, keyed by signature, defaulting to ``leave``."""
    params: dict[str, Param] = {}
    for group in groups:
        signature = str(group.get("signature"))
        failing = fix_failures(group)
        fails, stay = ("fails", "stays") if failing == 1 else ("fail", "stay")
        note = f" {failing} of its messages {fails} the playbook's fix and {stay} pending." if failing else ""
        params[signature] = Param(
            LEAVE,
            type="string",
            enum=list(GROUP_ACTIONS),
            title=f"{int(group.get('count') or 0)} x {_plain(group.get('error_class'), 60)}: "
            f"{_plain(group.get('template'), 80)}",
            description=f"Signature {signature}, origin {_plain(group.get('origin_topic'))}; "
            f"the playbook proposes '{proposal(group)}'.{note}",
        )
    return params


class DlqGroupApprovalOperator(HITLOperator, SkipMixin):
    """Ask a person which error groups of a dry-run to replay, archive or leave pending.

    The task returns (XCom) the decision: give its ``actions`` to ``DlqReplayOperator(group_actions=...)``
    and its ``dry_run_id`` to ``window_from``. When nothing is approved, the downstream tasks are skipped.

    :param dry_run_summary: The dry-run's summary, i.e. the ``DlqReplayOperator`` XCom (``dry_run.output``).
    :param response_timeout_seconds: How long the request waits; then nothing is approved. A number or a
        template rendering to one (e.g. from a Variable). (templated)
    :param max_groups: Groups shown in the form, largest first; the rest stay pending.
    :param subject: Headline of the request. (templated)
    :param kwargs: Further ``HITLOperator`` arguments (``notifiers``, ``assigned_users``, ...).

    .. seealso:: ``docs/approval.md``
    """

    APPLY = "Apply the chosen actions"
    NOTHING = "Approve nothing"
    inherits_from_skipmixin = True
    template_fields: Sequence[str] = ("subject", "body", "dry_run_summary", "response_timeout_seconds")

    def __init__(
        self,
        *,
        dry_run_summary: Any,
        response_timeout_seconds: float | str = 86400.0,
        max_groups: int = 50,
        subject: str = "Approve the DLQ replay, group by group",
        **kwargs: Any,
    ) -> None:
        for fixed in ("options", "defaults", "multiple", "response_timeout"):
            if fixed in kwargs:
                raise ValueError(
                    f"DlqGroupApprovalOperator sets {fixed!r} itself (one field per error group, "
                    "'Approve nothing' on timeout); use response_timeout_seconds for the timeout."
                )
        if isinstance(max_groups, bool) or not isinstance(max_groups, int) or max_groups < 1:
            raise ValueError(f"max_groups must be an integer >= 1; got {max_groups!r}.")
        super().__init__(
            subject=subject,
            options=[self.APPLY, self.NOTHING],
            defaults=[self.NOTHING],
            multiple=False,
            **kwargs,
        )
        self.dry_run_summary = dry_run_summary
        #: The dry-run's task, whose report the form links to (from ``dry_run.output``).
        self.dry_run_task_id: str | None = getattr(
            getattr(dry_run_summary, "operator", None), "task_id", None
        )
        self.response_timeout_seconds = response_timeout_seconds
        self.max_groups = max_groups

    def _summary(self) -> dict[str, Any]:
        summary = self.dry_run_summary
        if isinstance(summary, str):
            summary = json.loads(summary) if summary.strip() else {}
        if not isinstance(summary, dict) or "run_id" not in summary:
            raise ValueError(
                "dry_run_summary must be the dry-run's summary (the DlqReplayOperator XCom, e.g. "
                f"dry_run.output); got {type(self.dry_run_summary).__name__}."
            )
        if summary.get("mode") != "dry-run":
            raise ValueError(
                f"dry_run_summary must come from a dry-run; run {summary.get('run_id')!r} was mode "
                f"{summary.get('mode')!r}. Review a dry-run, then replay what was approved."
            )
        return summary

    def _timeout(self) -> timedelta:
        with suppress(TypeError, ValueError):
            if (seconds := float(self.response_timeout_seconds)) > 0:
                return timedelta(seconds=seconds)
        raise ValueError(
            f"response_timeout_seconds must be a positive number; got {self.response_timeout_seconds!r}."
        )

    def execute(self, context: Context) -> Any:
        summary = self._summary()
        self.response_timeout = self._timeout()
        groups = load_groups(summary)
        shown = groups[: self.max_groups]
        if not shown:
            self.log.info("Dry-run %s found no pending messages: nothing to approve.", summary["run_id"])
            return self._skip_downstream(context, self._result(summary, {}, {}))
        self.params = ParamsDict(group_params(shown))
        self.body = approval_body(summary, groups, len(shown), self._report_link(context, summary))
        self.log.info(
            "Asking for approval of %d error groups (%d messages) of dry-run %s; timeout %s",
            len(shown),
            sum(int(g.get("count") or 0) for g in shown),
            summary["run_id"],
            self.response_timeout,
        )
        return super().execute(context)

    def _report_link(self, context: Context, summary: Mapping[str, Any]) -> str | None:
        """The dry-run's report on the provider's API-server endpoint (the task's extra link)."""
        if not self.dry_run_task_id or not (summary.get("paths") or {}).get("report_html"):
            return None
        from airflow_provider_dlq.operators.links import api_base_url, report_endpoint

        ti = context["ti"]
        return report_endpoint(ti.dag_id, ti.run_id, self.dry_run_task_id, base=api_base_url())

    def validate_params_input(self, params_input: Mapping[str, Any]) -> None:
        """Each answered group must hold one of the actions (groups left out count as ``leave``)."""
        if bad := {k: v for k, v in params_input.items() if v not in GROUP_ACTIONS}:
            raise ValueError(f"Group actions {bad} must each be one of {', '.join(GROUP_ACTIONS)}.")

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        response = super().execute_complete(context, event)
        summary = self._summary()
        counts = {
            str(g.get("signature")): int(g.get("count") or 0) for g in load_groups(summary)[: self.max_groups]
        }
        answered = dict(response.get("params_input") or {})
        apply = self.NOTHING not in response["chosen_options"]
        actions = {sig: (answered.get(sig, LEAVE) if apply else LEAVE) for sig in counts}
        if unknown := sorted(set(answered) - set(counts)):
            self.log.warning("Ignoring answers for groups the dry-run did not show: %s", unknown)
        result = self._result(
            summary,
            actions,
            counts,
            responded_by=(response.get("responded_by_user") or {}).get("name"),
            timed_out=bool(event.get("timedout")),
        )
        self.log.info(
            "Approval %s (%s): replay %s, archive %s; the other %d groups stay pending",
            result["decision"],
            "timed out" if result["timed_out"] else f"by {result['responded_by']}",
            result["approved"][REPLAY],
            result["approved"][ARCHIVE],
            sum(1 for a in actions.values() if a == LEAVE),
        )
        return result if result["decision"] == "approved" else self._skip_downstream(context, result)

    @staticmethod
    def _result(
        summary: Mapping[str, Any],
        actions: dict[str, str],
        counts: dict[str, int],
        responded_by: str | None = None,
        timed_out: bool = False,
    ) -> dict[str, Any]:
        approved = {a: sorted(s for s, act in actions.items() if act == a) for a in (REPLAY, ARCHIVE)}
        return {
            "decision": "approved" if approved[REPLAY] or approved[ARCHIVE] else "nothing approved",
            "dry_run_id": summary.get("run_id"),
            "actions": actions,
            "approved": approved,
            "approved_messages": {a: sum(counts[s] for s in sigs) for a, sigs in approved.items()},
            "counts": counts,
            "responded_by": responded_by,
            "timed_out": timed_out,
        }

    def _skip_downstream(self, context: Context, result: dict[str, Any]) -> dict[str, Any]:
        """Skip the replay; the decision is pushed first (the SDK's ``skip`` ends the task by raising)."""
        if tasks := [t for t in context["task"].get_direct_relatives(upstream=False) if not t.is_teardown]:
            context["ti"].xcom_push(key="return_value", value=result)
            self.log.info("Nothing approved: skipping %s", [t.task_id for t in tasks])
            self.skip(ti=context["ti"], tasks=tasks)
        return result
