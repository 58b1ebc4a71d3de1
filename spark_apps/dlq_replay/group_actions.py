"""Per-group actions a reviewer approved (``--group-actions``, overriding the playbook) and the window of the
dry-run they reviewed (``--window-from``): see ``docs/approval.md``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pulsar_dlq_consumer.replay_options import GROUP_ACTIONS
from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay.errors import ReplayConfigError
from spark_apps.dlq_replay.redaction import shown

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from spark_apps.dlq_replay.options import ReplayOptions
    from spark_apps.dlq_replay.playbook import Rule
    from spark_apps.dlq_replay.pulsar_io.window import PartitionWindow
    from spark_apps.dlq_replay.run_context import Run

REPLAY, ARCHIVE, LEAVE = GROUP_ACTIONS  # an approval's actions, defined with the options
#: The rule name the report and the ledger show for a message decided by an approval.
APPROVAL_RULE = "approval"
_SIGNATURE = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def parse_group_actions(value: str) -> dict[str, str]:
    """``--group-actions``: a JSON object ``{"<signature>": "replay" | "archive" | "leave"}`` or ``@path``."""
    text = value.strip()
    where = "--group-actions"
    if text.startswith("@"):
        path = text[1:]
        where = f"--group-actions file {shown(path)}"
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ReplayConfigError(
                f"{where} cannot be read ({exc.strerror}); give a readable JSON file"
            ) from exc
    try:
        data: Any = json.loads(text)
    except ValueError as exc:
        raise ReplayConfigError(
            f"{where} is not valid JSON ({exc}); give an object such as "
            '{"3f2a9c1d0b7e4a55": "replay", "9d1e...": "leave"}'
        ) from exc
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise ReplayConfigError(f"{where} must be a JSON object of signature -> action; got {kind}")
    for signature in data:  # JSON object keys are strings; the options check the actions
        if not _SIGNATURE.fullmatch(str(signature)):
            raise ReplayConfigError(
                f"{where}: {shown(signature)} is not an error signature (copy them from a report's groups)"
            )
    return dict(data)


#: The action and reason of the rule an approval stands for.
_APPROVED = {
    REPLAY: (oc.REPUBLISH, "approved for replay"),
    ARCHIVE: (oc.ARCHIVE, "approved for archive"),
    LEAVE: (oc.SKIP, "left pending by the approval"),
}


def override_rule(action: str, playbook_rule: Rule | None) -> Rule:
    """The rule for a message of a group approved for ``action``: ``replay`` keeps a matching playbook
    ``republish`` rule (its fix still applies), else republishes the original; ``leave`` skips."""
    from spark_apps.dlq_replay.playbook import Rule

    if action == REPLAY and playbook_rule is not None and playbook_rule.action == oc.REPUBLISH:
        return playbook_rule
    rule_action, reason = _APPROVED[action]
    return Rule(name=APPROVAL_RULE, action=rule_action, line=0, reason=reason)


def reuse_window(options: ReplayOptions) -> list[PartitionWindow]:
    """The frozen window of the earlier run ``--window-from`` from its ``plan.json``; refused (before
    anything is read or sent) unless it read the same topics through the same subscription."""
    from pulsar_dlq_consumer.topics import normalize_topic
    from spark_apps.dlq_replay.pulsar_io.window import windows_from_json
    from spark_apps.dlq_replay.run_context import RunPaths
    from spark_apps.dlq_replay.storage import RunStorage

    run_id, topics, subscription = options.window_from, options.topics, options.subscription
    assert run_id is not None  # the callers reuse a window only with --window-from
    plan_path = RunPaths(options.output_dir, run_id).plan
    text = RunStorage().read_text(plan_path)
    if text is None:
        raise ReplayConfigError(
            f"--window-from {shown(run_id)}: {plan_path} does not exist; give the run id of a dry-run that "
            "wrote its plan under the same --output-dir"
        )
    plan = json.loads(text)
    reviewed = [normalize_topic(t) for t in plan.get("topics") or []]
    if reviewed != [normalize_topic(t) for t in topics] or plan.get("subscription") != subscription:
        raise ReplayConfigError(
            f"--window-from {shown(run_id)} read topics {plan.get('topics')} through subscription "
            f"{shown(plan.get('subscription'))}; this run reads {list(topics)} through "
            f"{shown(subscription)}. Use the same --topics and --subscription as the reviewed run"
        )
    return windows_from_json(plan["window"])


def reviewed_ids(run: Run) -> DataFrame | None:
    """With ``--window-from``: ``replay_id`` of what the reviewed run had in scope (not ``filtered``)."""
    from pyspark.sql import functions as F

    from spark_apps.dlq_replay.run_context import RunPaths
    from spark_apps.dlq_replay.schemas import DECIDED_SCHEMA
    from spark_apps.dlq_replay.storage import exists, join
    from spark_apps.dlq_replay.task_parquet import SUCCESS, read_frame

    if not run.options.window_from:
        return None
    decisions_path = RunPaths(run.options.output_dir, run.options.window_from).decisions
    if not exists(join(decisions_path, SUCCESS)):
        raise ReplayConfigError(
            f"--window-from: the reviewed run's decisions {decisions_path} are missing; the reviewed run "
            "must have completed its decide step under the same --output-dir"
        )
    decisions = read_frame(run.spark, decisions_path, DECIDED_SCHEMA)
    return decisions.filter(F.col("outcome") != F.lit(oc.FILTERED)).select("replay_id")
