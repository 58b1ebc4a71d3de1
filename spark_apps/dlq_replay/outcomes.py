"""Actions a playbook can choose and outcomes a DLQ message can end a run with."""

from __future__ import annotations

# The run modes are the options' own (one definition, shared with the Airflow operator).
from pulsar_dlq_consumer.replay_options import ARCHIVE_ONLY as ARCHIVE_ONLY
from pulsar_dlq_consumer.replay_options import DRY_RUN as DRY_RUN
from pulsar_dlq_consumer.replay_options import REPLAY as REPLAY

REPUBLISH = "republish"
ARCHIVE = "archive"
DROP = "drop"
SKIP = "skip"
ACTIONS: tuple[str, ...] = (REPUBLISH, ARCHIVE, DROP, SKIP)

ON_FIX_ERROR_PENDING = "pending"
ON_FIX_ERROR_ARCHIVE = "archive"
ON_FIX_ERROR_CHOICES: tuple[str, ...] = (ON_FIX_ERROR_PENDING, ON_FIX_ERROR_ARCHIVE)

REPUBLISHED = "republished"
ARCHIVED = "archived"
DROPPED = "dropped"
SKIPPED = "skipped"
FIX_FAILED = "fix_failed"
ORIGIN_REFUSED = "origin_refused"
MALFORMED = "malformed"
LOOP_GUARDED = "loop_guarded"
ALREADY_FINAL = "already_final"
DUPLICATE = "duplicate"
ORIGIN_CONFLICT = "origin_conflict"
FILTERED = "filtered"
PUBLISH_FAILED = "publish_failed"
#: Not sent: the group's canary failed again in the consumer (``--canary``); the message stays pending.
CANARY_FAILED = "canary_failed"

#: Decided in the decide step; becomes ``republished`` or ``publish_failed`` in the apply step.
TO_REPUBLISH = "to_republish"

#: Outcomes whose DLQ message is done with: recorded final in the ledger and acked by the commit.
FINAL_OUTCOMES: frozenset[str] = frozenset(
    {REPUBLISHED, ARCHIVED, DROPPED, LOOP_GUARDED, ALREADY_FINAL, DUPLICATE}
)

#: Outcomes decided before the playbook applies (out of the run's scope): reports explain them without rules.
UNSCOPED: tuple[str, ...] = (FILTERED, ALREADY_FINAL)

#: Outcomes that are written to the archive dataset in the apply step.
ARCHIVE_OUTCOMES: frozenset[str] = frozenset({ARCHIVED, LOOP_GUARDED})

#: Every outcome a message can end a run with, in report order.
OUTCOMES: tuple[str, ...] = (
    REPUBLISHED,
    ARCHIVED,
    DROPPED,
    SKIPPED,
    FIX_FAILED,
    ORIGIN_REFUSED,
    ORIGIN_CONFLICT,
    MALFORMED,
    LOOP_GUARDED,
    ALREADY_FINAL,
    DUPLICATE,
    FILTERED,
    PUBLISH_FAILED,
    CANARY_FAILED,
)
