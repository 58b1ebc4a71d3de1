"""Lineage properties of a replayed message, and reading a message's previous replay count."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pulsar_dlq_consumer.context import is_bookkeeping_property
from spark_apps.dlq_replay.arrow_util import map_entries, per_distinct, prefix_counts

if TYPE_CHECKING:
    from collections.abc import Mapping

REPLAY_ID = "REPLAY_ID"
REPLAY_RUN_ID = "REPLAY_RUN_ID"
REPLAY_COUNT = "REPLAY_COUNT"
REPLAYED_FROM = "REPLAYED_FROM"
REPLAY_FIX = "REPLAY_FIX"
LINEAGE_KEYS: tuple[str, ...] = (REPLAY_ID, REPLAY_RUN_ID, REPLAY_COUNT, REPLAYED_FROM, REPLAY_FIX)

_COUNT = re.compile(r"[0-9]{1,9}")


def previous_replay_count(properties: Mapping[str, str] | None) -> int | None:
    """The ``REPLAY_COUNT`` a message already carries: 0 when absent, ``None`` when not a number."""
    raw = (properties or {}).get(REPLAY_COUNT)
    if raw is None:
        return 0
    text = raw.strip() if isinstance(raw, str) else ""
    return int(text) if _COUNT.fullmatch(text) else None


def lineage_maps(
    properties: pa.Array,
    rows: pa.Array,
    replay_ids: pa.Array,
    run_id: str,
    previous_counts: pa.Array,
    dlq_topics: pa.Array,
    fix_labels: pa.Array,
) -> pa.Array:
    """The properties of the replayed message of each row where ``rows`` is true (null elsewhere), by Arrow
    kernels: the row's ``properties`` in their order without DLQ bookkeeping and earlier lineage, then the
    :data:`LINEAGE_KEYS` from the other (per row) arguments."""
    width = len(LINEAGE_KEYS)
    rows = pc.fill_null(rows, False)
    keys, items, parents, relative = map_entries(properties)
    own = pc.and_(rows, properties.is_valid()).take(parents)
    stripped = per_distinct(keys, lambda key: is_bookkeeping_property(key) or key in LINEAGE_KEYS, pa.bool_())
    keep = pc.and_(own, pc.invert(stripped))
    kept_before = prefix_counts(keep)  # entry e: kept entries before it; [E]: all kept
    rows_before = prefix_counts(rows)  # row r: chosen rows before it; [n]: all chosen
    # Each chosen row's map holds its kept entries, then `width` lineage entries: the entries of the
    # rows before it are all kept entries before it plus `width` per chosen row before it.
    out_offsets = pc.add(kept_before.take(relative), pc.multiply(rows_before, width))
    kept = pc.indices_nonzero(keep)
    kept_slots = pc.add(kept_before.take(kept), pc.multiply(rows_before.take(parents.take(kept)), width))
    chosen = pc.indices_nonzero(rows)
    m = len(chosen)
    lineage_columns = [
        replay_ids.take(chosen),
        pa.array([run_id] * m, pa.string()),
        pc.cast(pc.add(pc.cast(previous_counts.take(chosen), pa.int64()), 1), pa.string()),
        dlq_topics.take(chosen),
        fix_labels.take(chosen),
    ]
    # The lineage entries row-major (chosen row j's key k at j * width + k), each at the end of its map.
    by_column = (np.arange(m)[:, None] + np.arange(width) * m).ravel()
    lineage_values = pa.concat_arrays([c.cast(pa.string()) for c in lineage_columns]).take(by_column)
    ends = out_offsets.take(pc.add(chosen, 1)).to_numpy()
    lineage_slots = (ends[:, None] - width + np.arange(width)).ravel()
    source = np.empty(len(kept) + m * width, np.int64)  # the entry of each output slot: kept, then lineage
    source[np.concatenate([kept_slots.to_numpy(), lineage_slots])] = np.arange(len(source))
    out_keys = pa.concat_arrays([keys.take(kept), pa.array(LINEAGE_KEYS * m, pa.string())]).take(source)
    out_items = pa.concat_arrays([items.take(kept), lineage_values]).take(source)
    valid_offsets = pc.cast(out_offsets, pa.int32())
    null_rows = pc.invert(rows)
    if null_rows.true_count:  # a null offset makes that row's map null (the offsets after it hold)
        mask = pa.concat_arrays([null_rows, pa.array([False])])
        valid_offsets = pc.if_else(mask, pa.scalar(None, pa.int32()), valid_offsets)
    return pa.MapArray.from_arrays(valid_offsets, out_keys, out_items, type=properties.type)
