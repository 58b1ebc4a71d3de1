"""report_parts: the report's group aggregates and representatives gathered per bucket with pyarrow and
merged, against a plain Python computation of what Spark's queries over the run would return (the
reference in ``tests/integration/replay/report_reference.py``)."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay import report_parts, storage
from spark_apps.dlq_replay.report_parts import (
    COMBO_KEYS,
    REP_COLUMNS,
    SAMPLE_IDS,
    BucketParts,
    first_k,
    iso,
    read_parts,
    snapshot_rows,
)

T0 = datetime(2024, 5, 1, tzinfo=UTC)
CEST = timezone(timedelta(hours=2))
LEDGER_COLUMNS = (
    *COMBO_KEYS, "error_template", "error_class", "origin_topic", "reason", "dlq_topic", "dlq_message_id",
    "publish_time",
)  # fmt: skip


def _batch(rows: list[dict], columns) -> pa.RecordBatch:
    types = [pa.timestamp("us", "UTC") if name == "publish_time" else pa.string() for name in columns]
    schema = pa.schema(list(zip(columns, types, strict=True)))
    return pa.RecordBatch.from_pylist([{k: r[k] for k in columns} for r in rows], schema)


def _nulls_first(value):
    return (0, "") if value is None else (1, value)


def test_first_k_keeps_each_groups_first_rows_nulls_first():
    rows = [
        {"g": None, "h": "x", "t": 3},
        {"g": None, "h": "x", "t": None},
        {"g": None, "h": None, "t": 1},
        {"g": "a", "h": "x", "t": 2},
        {"g": "a", "h": "x", "t": 1},
        {"g": "a", "h": "x", "t": 1},
        {"g": "a", "h": "x", "t": 5},
        {"g": "b", "h": "y", "t": 0},
    ]
    table = pa.Table.from_pylist(rows, pa.schema([("g", pa.string()), ("h", pa.string()), ("t", pa.int64())]))
    kept = first_k(table, ["g", "h"], ["t"], 2).to_pylist()
    assert kept == [
        {"g": None, "h": None, "t": 1},
        {"g": None, "h": "x", "t": None},
        {"g": None, "h": "x", "t": 3},
        {"g": "a", "h": "x", "t": 1},
        {"g": "a", "h": "x", "t": 1},
        {"g": "b", "h": "y", "t": 0},
    ]
    assert first_k(table.slice(0, 0), ["g"], ["t"], 2).num_rows == 0


def _rows(bucket: int, n: int, rng: random.Random) -> list[dict]:
    rows = []
    for i in range(n):
        sig = rng.choice(["s1", "s2", "s3", None])
        minute = rng.choice([0, 1, 1, 2, None])
        rows.append(
            {
                "signature": sig,
                "outcome": rng.choice([oc.TO_REPUBLISH, oc.ARCHIVED, oc.FILTERED, oc.ALREADY_FINAL, None]),
                "action": rng.choice(["republish", None]),
                "rule": rng.choice(["r1", "r2", None]),
                "error_template": rng.choice(["t<num>", "u", None]),
                "error_class": rng.choice(["E", "F", None]),
                "origin_topic": rng.choice(["o1", "o2", None]),
                "reason": rng.choice(["term", None]),
                "context_format": rng.choice(["ours", "kip-1191", None]),
                "dlq_topic": rng.choice(["dlq-a", "dlq-b"]),
                "dlq_message_id": f"{bucket}:{i}:-1:-1",
                "publish_time": None if minute is None else T0 + timedelta(minutes=minute, microseconds=i),
                "error_message": rng.choice(["boom " + "x" * 600, "bang", None]),
                "outcome_reason": "why",
            }
        )
    return rows


def _expected_combos(rows: list[dict]) -> dict[tuple, dict]:
    combos: dict[tuple, dict] = {}
    for row in rows:
        key = tuple(row[k] for k in COMBO_KEYS)
        combo = combos.setdefault(key, {"n": 0, "times": [], "mins": {}})
        combo["n"] += 1
        if row["publish_time"] is not None:
            combo["times"].append(row["publish_time"])
        for column, name in (("error_template", "template"), ("error_class", "error_class"),
                             ("origin_topic", "origin_topic"), ("reason", "reason")):  # fmt: skip
            if row[column] is not None:
                combo["mins"][name] = min(combo["mins"].get(name, row[column]), row[column])
    return combos


def test_parts_of_two_buckets_merge_into_sparks_aggregates(tmp_path, monkeypatch):
    """Reduced every 7 rows and merged every 3 chunks within a bucket, then merged across two buckets,
    the parts give the counts, minima, first/last times, formats, samples and representatives of all
    rows together."""
    monkeypatch.setattr(report_parts, "REDUCE_ROWS", 7)
    monkeypatch.setattr(report_parts, "MERGE_EVERY", 3)
    rng = random.Random(5)
    folder = str(tmp_path / "parts")
    storage.delete(folder)
    everything = []
    for bucket in (0, 1):
        rows = _rows(bucket, 60, rng)
        everything += rows
        parts = BucketParts(bucket, folder)
        for start in range(0, len(rows), 4):  # the ledger batches and the decisions they came from
            chunk = rows[start : start + 4]
            parts.add(_batch(chunk, LEDGER_COLUMNS), _batch(chunk, REP_COLUMNS))
        parts.write()
    merged = read_parts(folder)

    expected = _expected_combos(everything)
    got = {tuple(c[k] for k in COMBO_KEYS): c for c in merged.combos}
    assert set(got) == set(expected)
    for key, want in expected.items():
        combo = got[key]
        assert combo["n"] == want["n"]
        assert combo["first_seen"] == (iso(min(want["times"])) if want["times"] else None)
        assert combo["last_seen"] == (iso(max(want["times"])) if want["times"] else None)
        for name in ("template", "error_class", "origin_topic", "reason"):
            assert combo[name] == want["mins"].get(name)

    by_sig: dict = {}
    for row in everything:
        by_sig.setdefault(row["signature"], []).append(row)
    order = ("publish_time", "dlq_topic", "dlq_message_id")
    for sig, rows in by_sig.items():
        first = sorted(rows, key=lambda r: tuple(_nulls_first(r[k]) for k in order))[:SAMPLE_IDS]
        assert merged.samples[sig] == [r["dlq_message_id"] for r in first]

    def rep_key(row):
        unscoped = None if row["outcome"] is None else int(row["outcome"] in oc.UNSCOPED)
        return (_nulls_first(unscoped), *(_nulls_first(row[k]) for k in order))

    reps: dict = {}
    for rep in merged.reps:
        reps.setdefault(rep["signature"], []).append(rep)
    for sig, rows in by_sig.items():
        want = sorted(rows, key=rep_key)[: report_parts.REP_ROWS]
        assert [r["dlq_message_id"] for r in reps[sig]] == [r["dlq_message_id"] for r in want]
        for rep, row in zip(reps[sig], want, strict=True):
            message = row["error_message"]
            assert rep["error_message"] == (None if message is None else message[:500])


def test_deleting_the_folder_drops_an_earlier_attempts_parts(tmp_path):
    folder = str(tmp_path / "parts")
    storage.delete(folder)
    parts = BucketParts(3, folder)
    rows = _rows(3, 5, random.Random(1))
    parts.add(_batch(rows, LEDGER_COLUMNS), _batch(rows, REP_COLUMNS))
    parts.write()
    assert sum(c["n"] for c in read_parts(folder).combos) == 5
    storage.delete(folder)
    empty = read_parts(folder)
    assert (empty.combos, empty.samples, empty.reps) == ([], {}, [])


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (datetime(2024, 5, 1, 12, 0, 1, 999_999, tzinfo=UTC), "2024-05-01T12:00:01.999Z"),
        (
            datetime(2024, 5, 1, 14, 0, 0, 5_000, tzinfo=timezone(timedelta(hours=2))),
            "2024-05-01T12:00:00.005Z",
        ),
        (None, None),
    ],
)
def test_iso_is_sparks_millisecond_utc_format(value, text):
    assert iso(value) == text


def test_snapshot_messages_reads_only_the_wanted_rows(tmp_path):
    """The wanted messages are found across files and row groups; a key in another topic is not."""
    schema = pa.schema(
        [("topic", pa.string()), ("message_id_str", pa.string()),
         ("properties", pa.map_(pa.string(), pa.string())), ("value", pa.binary())]
    )  # fmt: skip
    folder = tmp_path / "snapshot"
    folder.mkdir()
    for part in (0, 1):
        rows = [
            {"topic": f"t{part}", "message_id_str": f"{part}:{i}", "properties": [("k", str(i))],
             "value": f"v{i}".encode()}
            for i in range(10)
        ]  # fmt: skip
        pq.write_table(
            pa.Table.from_pylist(rows, schema), folder / f"part-{part:05d}.parquet", row_group_size=3
        )
    (folder / "_SUCCESS").write_text("")
    keys = [("t0", "0:4"), ("t1", "1:9"), ("t0", "1:9")]

    def found(keys, columns):  # what the task yields, by message
        rows = [row for batch in snapshot_rows(str(folder), keys, columns) for row in batch.to_pylist()]
        return {(row["topic"], row["message_id_str"]): row for row in rows}

    everything = ["topic", "message_id_str", "properties", "value"]
    assert sorted(found(keys, everything)) == [("t0", "0:4"), ("t1", "1:9")]
    assert found(keys, everything)[("t1", "1:9")]["properties"] == [("k", "9")]
    assert found(keys, everything)[("t0", "0:4")]["value"] == b"v4"
    assert list(found(keys[:1], everything[:3])[("t0", "0:4")]) == everything[:3]


def test_sample_errors_from_the_parts_and_one_counting_pass(tmp_path, monkeypatch):
    """Each signature's first messages by (earliest time, message), kept in 7-row chunks merged every 3
    chunks in two buckets, are those of all rows together; the report's ``_errors`` counts them over the
    decisions' files (cut to 500 characters, as the report cuts them) and counts the fix errors."""
    from spark_apps.dlq_replay.report_parts import SAMPLE_ERRORS, error_count_rows
    from spark_apps.dlq_replay.task_parquet import part_file

    monkeypatch.setattr(report_parts, "REDUCE_ROWS", 7)
    monkeypatch.setattr(report_parts, "MERGE_EVERY", 3)
    rng = random.Random(11)
    folder, decisions = str(tmp_path / "parts"), tmp_path / "decisions"
    storage.delete(folder)
    decisions.mkdir()
    everything = []
    for bucket in (0, 1):
        rows = _rows(bucket, 80, rng)
        for i, row in enumerate(rows):
            tail = "y" * 600 if rng.random() < 0.2 else ""
            row["error_message"] = rng.choice([f"m{rng.randint(0, 12)}{tail}", None])
            row["fix_error"] = rng.choice([None] * 9 + ["ValueError: no"])
            row["publish_time"] = T0 + timedelta(minutes=rng.randint(0, 5), microseconds=i)
        everything += rows
        parts = BucketParts(bucket, folder)
        for start in range(0, len(rows), 4):
            chunk = rows[start : start + 4]
            parts.add(_batch(chunk, LEDGER_COLUMNS), _batch(chunk, REP_COLUMNS))
        parts.write()
        columns = ("signature", "error_message", "fix_error")
        pq.write_table(pa.Table.from_batches([_batch(rows, columns)]), part_file(str(decisions), bucket))
    merged = read_parts(folder)
    assert merged.errors is not None

    earliest: dict = {}
    for row in everything:
        if row["error_message"] is None:
            continue
        key = (row["signature"], row["error_message"][:500])
        earliest[key] = min(earliest.get(key, row["publish_time"]), row["publish_time"])
    for sig in {row["signature"] for row in everything}:
        mine = sorted((t, m) for (s, m), t in earliest.items() if s == sig)
        assert merged.errors.get(sig, []) == [m for _, m in mine[:SAMPLE_ERRORS]], sig
    wanted = {sig: messages for sig, messages in merged.errors.items() if sig is not None}
    files = [part_file(str(decisions), bucket) for bucket in (0, 1)]
    counts: Counter = Counter()
    fixes: Counter = Counter()
    for task in (0, 1):  # each decisions file in its own task, summed as the report sums them
        for row in (r for b in error_count_rows(files, wanted, sorted(wanted), task) for r in b.to_pylist()):
            (fixes if row["fix"] else counts)[(row["signature"], row["text"])] += row["n"]
    cut = [(r["signature"], r["error_message"] and r["error_message"][:500]) for r in everything]
    for sig, messages in wanted.items():
        for message in messages:
            assert counts[(sig, message)] == cut.count((sig, message))
    fixed = [
        (r["signature"], r["fix_error"]) for r in everything if r["signature"] in wanted and r["fix_error"]
    ]
    assert fixes == Counter(fixed)
    assert fixes
    # A message a copy of which has no publish time comes first, even where its other copies are late:
    # its first time is null, so the parts still merge exactly.
    late = {**everything[0], "error_message": "late", "publish_time": T0 + timedelta(days=1)}
    early = {**late, "error_message": "early", "publish_time": T0}
    for bucket, rows in ((0, [{**late, "publish_time": None}]), (1, [early, late])):
        parts = BucketParts(bucket, folder)
        parts.add(_batch(rows, LEDGER_COLUMNS), _batch(rows, REP_COLUMNS))
        parts.write()
    assert read_parts(folder).errors == {late["signature"]: ["late", "early"]}
