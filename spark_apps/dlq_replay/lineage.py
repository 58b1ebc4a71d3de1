"""Lineage properties of a replayed message, and reading a message's previous replay count."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pulsar_dlq_consumer.context import is_bookkeeping_property

if TYPE_CHECKING:
    from collections.abc import Mapping

REPLAY_ID = "REPLAY_ID"
REPLAY_RUN_ID = "REPLAY_RUN_ID"
REPLAY_COUNT = "REPLAY_COUNT"
REPLAYED_FROM = "REPLAYED_FROM"
REPLAY_FIX = "REPLAY_FIX"
LINEAGE_KEYS: tuple[str, ...] = (REPLAY_ID, REPLAY_RUN_ID, REPLAY_COUNT, REPLAYED_FROM, REPLAY_FIX)

_COUNT = re.compile(r"[0-9]{1,9}")
_STRIPPED: dict[str, bool] = {}  # property keys repeat from message to message
_STRIPPED_MAX = 10_000


def _stripped(key: str) -> bool:
    """Is ``key`` removed from a replayed message (DLQ bookkeeping or a lineage key set anew)?"""
    found = _STRIPPED.get(key)
    if found is None:
        found = is_bookkeeping_property(key) or key in LINEAGE_KEYS
        if len(_STRIPPED) < _STRIPPED_MAX:
            _STRIPPED[key] = found
    return found


def previous_replay_count(properties: Mapping[str, str] | None) -> int | None:
    """The ``REPLAY_COUNT`` a message already carries: 0 when absent, ``None`` when not a number."""
    if not properties:
        return 0
    raw = properties.get(REPLAY_COUNT)
    if raw is None:
        return 0
    if not isinstance(raw, str) or not _COUNT.fullmatch(raw.strip()):
        return None
    return int(raw.strip())


def republish_properties(
    properties: Mapping[str, str],
    *,
    replay_id: str,
    run_id: str,
    previous_count: int,
    dlq_topic: str,
    fix_label: str,
) -> dict[str, str]:
    """Properties of the replayed message: DLQ bookkeeping stripped, lineage set (overriding any copy)."""
    known = _STRIPPED  # keys repeat: a dict lookup per key, the full test only for a new key
    out = {k: v for k, v in properties.items() if not (known[k] if k in known else _stripped(k))}
    out[REPLAY_ID] = replay_id
    out[REPLAY_RUN_ID] = run_id
    out[REPLAY_COUNT] = str(previous_count + 1)
    out[REPLAYED_FROM] = dlq_topic
    out[REPLAY_FIX] = fix_label
    return out
