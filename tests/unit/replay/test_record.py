"""record: a bucket's send results gathered from every wave, placed at their decisions rows, and the
ledger rows of its decisions with those results applied."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq

from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay.canary import HALTED_REASON
from spark_apps.dlq_replay.record import (
    DECIDED_COLUMNS,
    LEDGER_FILE_SCHEMA,
    bucket_results,
    ledger_batch,
    result_positions,
)
from spark_apps.dlq_replay.task_parquet import part_file

T0 = datetime(2024, 5, 1, tzinfo=UTC)
RESULT_TYPES = pa.schema(
    [("replay_id", pa.string()), ("published", pa.bool_()), ("published_message_id", pa.string()),
     ("error", pa.string()), ("row", pa.int64())]
)  # fmt: skip


def _decided(rows: list[tuple[str, str, str | None]]) -> pa.RecordBatch:
    """Decisions ``(replay_id, outcome, outcome_reason)``; the other copied columns are per-row text."""
    columns: dict[str, pa.Array] = {}
    for name in DECIDED_COLUMNS:
        if name == "publish_time":
            columns[name] = pa.array([T0] * len(rows), pa.timestamp("us", "UTC"))
        elif name in ("replay_id", "outcome", "outcome_reason"):
            index = ("replay_id", "outcome", "outcome_reason").index(name)
            columns[name] = pa.array([row[index] for row in rows], pa.string())
        else:
            columns[name] = pa.array([f"{name}-{i}" for i in range(len(rows))], pa.string())
    return pa.RecordBatch.from_pydict(columns)


def _results(rows: list[tuple[str, bool, str | None, str | None, int]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [dict(zip(RESULT_TYPES.names, r, strict=True)) for r in rows], RESULT_TYPES
    )


def positions_of(decided, results):
    """Each row's send result position, as a record task finds it (``None`` without results)."""
    if results is None or results.num_rows == 0:
        return None
    return result_positions(results, decided.num_rows)


def test_ledger_rows_apply_the_buckets_send_results():
    decided = _decided(
        [
            ("a", oc.TO_REPUBLISH, None),  # sent and confirmed
            ("b", oc.TO_REPUBLISH, None),  # sent, failed
            ("c", oc.TO_REPUBLISH, None),  # no result (its wave never saved one)
            ("a", oc.DUPLICATE, "another copy of this original is republished in this run"),
            ("d", oc.ARCHIVED, "rule 'poison' says archive"),
            ("e", oc.SKIPPED, "rule says skip"),
        ]
    )
    results = _results([("b", False, None, "topic terminated", 1), ("a", True, "7:3:-1:0", None, 0)])
    positions = positions_of(decided, results)
    assert positions is not None
    assert positions.to_pylist() == [1, 0, None, None, None, None]  # only rows sent have a result
    rows = ledger_batch(decided, results, positions, oc.REPLAY, T0).to_pylist()
    # A batch gets its slice of the bucket's positions.
    tail = ledger_batch(decided.slice(1), results, positions.slice(1), oc.REPLAY, T0).to_pylist()
    assert tail == rows[1:]

    assert [r["outcome"] for r in rows] == [
        oc.REPUBLISHED, oc.PUBLISH_FAILED, oc.PUBLISH_FAILED, oc.DUPLICATE, oc.ARCHIVED, oc.SKIPPED
    ]  # fmt: skip
    assert [r["outcome_reason"] for r in rows] == [
        None,
        "publish failed: topic terminated",
        "publish failed: no send result",
        "another copy of this original is republished in this run",
        "rule 'poison' says archive",
        "rule says skip",
    ]
    # Only the row sent gets the message id, not the other copy of its original.
    assert [r["published_message_id"] for r in rows] == ["7:3:-1:0", None, None, None, None, None]
    assert [r["final"] for r in rows] == [r["outcome"] in oc.FINAL_OUTCOMES for r in rows]
    assert (rows[0]["final"], rows[1]["final"], rows[5]["final"]) == (True, False, False)
    assert {r["mode"] for r in rows} == {oc.REPLAY}
    assert {r["recorded_at"] for r in rows} == {T0}
    assert [r["signature"] for r in rows] == [f"signature-{i}" for i in range(6)]
    assert list(rows[0]) == LEDGER_FILE_SCHEMA.names  # Spark's column order, no run_id (its folder)


def test_ledger_rows_of_a_bucket_that_sent_nothing():
    decided = _decided([("a", oc.TO_REPUBLISH, None), ("d", oc.ARCHIVED, "archived")])
    for results in (None, _results([])):
        positions = positions_of(decided, results)
        assert positions is None
        rows = ledger_batch(decided, results, positions, oc.REPLAY, T0).to_pylist()
        assert [r["outcome"] for r in rows] == [oc.PUBLISH_FAILED, oc.ARCHIVED]
        assert rows[0]["outcome_reason"] == "publish failed: no send result"
        assert [r["published_message_id"] for r in rows] == [None, None]


def test_bucket_results_gather_every_wave_of_that_bucket_only(tmp_path):
    for wave, bucket, ids in ((0, 0, "ab"), (0, 1, "x"), (2, 0, "c"), (3, 1, "y")):
        folder = tmp_path / "republish [x]" / f"wave={wave}"  # glob characters in the path are literal
        folder.mkdir(parents=True, exist_ok=True)
        table = pa.Table.from_batches([_results([(i, True, f"1:{i}", None, ord(i)) for i in ids])])
        pq.write_table(table, part_file(str(folder), bucket))
    results = bucket_results(str(tmp_path / "republish [x]"), 0)
    assert results is not None
    assert results.column("row").to_pylist() == [ord(i) for i in "abc"]  # wave by wave
    assert bucket_results(str(tmp_path / "republish [x]"), 5) is None
    assert bucket_results(str(tmp_path / "missing"), 0) is None


def test_result_positions_place_each_result_at_its_row_whatever_the_receipt_order():
    # Results in the order the brokers confirmed them (producers interleaved), not the file's order;
    # row 2 is not sent and row 7's wave saved no result.
    results = _results([(f"r{row}", True, f"m-{row}", None, row) for row in (5, 0, 1, 4, 6, 3)])
    assert result_positions(results, 8).to_pylist() == [1, 2, None, 5, 3, 0, 4, None]
    # A results batch that is a slice reads its rows from the slice's first one.
    assert result_positions(results.slice(2), 8).to_pylist() == [None, 0, None, 3, 1, None, 2, None]


def test_a_halted_group_s_unsent_rows_are_canary_failed_and_its_canaries_keep_their_result():
    decided = _decided(
        [
            ("c1", oc.TO_REPUBLISH, None),  # the halted group's canary: published
            ("c2", oc.TO_REPUBLISH, None),  # its other canary: not published
            ("h1", oc.TO_REPUBLISH, None),  # the halted group's rest: never sent
            ("k1", oc.TO_REPUBLISH, None),  # another group, sent in a wave
            ("k2", oc.TO_REPUBLISH, None),  # another group, no result (its wave saved none)
            ("a1", oc.ARCHIVED, "archived"),
        ]
    )
    signatures = ["bad", "bad", "bad", "good", "good", "bad"]
    decided = decided.set_column(
        decided.schema.get_field_index("signature"), "signature", pa.array(signatures)
    )
    results = _results(
        [("c1", True, "1:1", None, 0), ("c2", False, None, "timeout", 1), ("k1", True, "1:2", None, 3)]
    )
    positions = positions_of(decided, results)
    rows = ledger_batch(decided, results, positions, oc.REPLAY, T0, halted=("bad",)).to_pylist()
    assert [r["outcome"] for r in rows] == [
        oc.REPUBLISHED, oc.PUBLISH_FAILED, oc.CANARY_FAILED, oc.REPUBLISHED, oc.PUBLISH_FAILED, oc.ARCHIVED
    ]  # fmt: skip
    assert rows[2]["outcome_reason"] == HALTED_REASON
    assert rows[1]["outcome_reason"] == "publish failed: timeout"
    assert [r["final"] for r in rows][:3] == [True, False, False]
    # A bucket none of whose rows was sent: every halted row is canary_failed.
    alone = ledger_batch(decided.slice(2, 1), None, None, oc.REPLAY, T0, halted=("bad",)).to_pylist()
    assert alone[0]["outcome"] == oc.CANARY_FAILED
