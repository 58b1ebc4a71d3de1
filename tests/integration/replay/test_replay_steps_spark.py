"""The DataFrame steps on local Spark: normalise, scope, decide, producers, archive, ledger, report."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from functools import partial

import pyarrow.parquet as pq
import pytest
from ledger_reference import ledger_rows, with_publish_results, write_ledger
from pyspark.testing import assertDataFrameEqual
from report_reference import OUTCOME_COLUMNS, aggregate, dry_run_outcomes, spark_parts

from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay import scope, task_parquet
from spark_apps.dlq_replay.decide import DecideSettings, decide_tasks
from spark_apps.dlq_replay.ledger import final_ids, read_ledger
from spark_apps.dlq_replay.normalize import normalize_columns
from spark_apps.dlq_replay.playbook import parse_playbook
from spark_apps.dlq_replay.report import CommitTotals, build_report
from spark_apps.dlq_replay.schemas import (
    DECIDED_SCHEMA,
    IDENTITIES_SCHEMA,
    LEDGER_SCHEMA,
    REPLAY_ID_MARK,
    SNAPSHOT_FILE_SCHEMA,
    SNAPSHOT_SCHEMA,
)
from spark_apps.dlq_replay.scope import Filters, repeated_ids, scope_marks
from spark_apps.dlq_replay.snapshot import with_replay_ids
from spark_apps.dlq_replay.storage import RunStorage
from spark_apps.dlq_replay.topics import TopicMatcher

pytestmark = pytest.mark.integration

DLQ = "persistent://public/default/orders-sub-DLQ"
T0 = datetime(2024, 5, 1, tzinfo=UTC)
PLAYBOOK = parse_playbook(
    """
rules:
  - {name: replay-timeouts, match: {error_class: Timeout}, action: republish}
  - {name: archive-poison, match: {error_class: Poison}, action: archive, archive_payload: false}
"""
)


def props(cls: str, origin: str = "persistent://public/default/orders") -> dict[str, str]:
    return {
        "REAL_TOPIC": origin,
        "__dlq.errors.reason": "term",
        "__dlq.errors.exception.class": cls,
        "__dlq.errors.exception.message": "failed 42",
    }


def snapshot_df(spark, n_timeout: int = 40, n_poison: int = 6, n_junk: int = 3):
    rows = []
    kinds = [("Timeout", n_timeout), ("Poison", n_poison)]
    i = 0
    for cls, count in kinds:
        for _ in range(count):
            rows.append(
                (DLQ, -1, str(i).encode(), f"1:{i}:-1:-1", f"k{i}", None, f"payload-{i}".encode(), props(cls),
                 T0 + timedelta(minutes=i), None, 0, "p", 1)
            )  # fmt: skip
            i += 1
    for _ in range(n_junk):
        rows.append((DLQ, -1, b"x", f"1:{i}:-1:-1", f"k{i}", None, b"?", {"x": "y"}, T0, None, 0, "p", 1))
        i += 1
    return spark.createDataFrame(rows, SNAPSHOT_SCHEMA).repartition(3)


_CALLS = itertools.count()
_WORK: list = []


@pytest.fixture(autouse=True)
def _decide_folder(tmp_path):
    _WORK[:] = [tmp_path / "decide"]


def decide(snapshot, playbook, settings, producers_per_target, **options):
    """The decide step's tasks over ``snapshot`` as production runs them: the snapshot written as its read
    tasks write it, each decide task reading its share of the files with the marks file; the decisions
    returned as a DataFrame instead of written."""
    folder = _WORK[0] / f"call-{next(_CALLS)}"
    snapshot_dir = str(folder / "snapshot")
    write_snapshot(snapshot, snapshot_dir, playbook.origin_precedence)
    written = task_parquet.read_frame(snapshot.sparkSession, snapshot_dir, SNAPSHOT_SCHEMA)
    frame, task = decide_tasks(
        written,
        playbook,
        settings,
        producers_per_target,
        snapshot_dir=snapshot_dir,
        marks_dir=str(folder / "marks"),
        **options,
    )
    return frame.mapInArrow(task, DECIDED_SCHEMA)


def write_snapshot(snapshot, folder, origin_precedence=()):
    """Write ``snapshot``'s rows to ``folder`` as the read tasks write them: each with its replay id."""

    def rows(batches):  # defined here: the tasks get it by value
        yield from batches

    read = partial(with_replay_ids, rows, origin_precedence)
    tally = task_parquet.row_tally
    return task_parquet.write_in_tasks(snapshot, read, SNAPSHOT_FILE_SCHEMA, folder, tally, ("n",))


def settings(mode=oc.REPLAY):
    return DecideSettings(run_id="run-1", mode=mode, allowlist=TopicMatcher.parse(["orders"]))


def counts(df, column="outcome"):
    return {r[column]: r["count"] for r in df.groupBy(column).count().collect()}


def test_decide_pipeline_counts_and_producers(spark):
    snap = snapshot_df(spark)
    decided = decide(snap, PLAYBOOK, settings(), producers_per_target=3).cache()
    assert decided.count() == 49
    assert counts(decided) == {oc.TO_REPUBLISH: 40, oc.ARCHIVED: 6, oc.MALFORMED: 3}
    sending = decided.filter("outcome = 'to_republish'").select("replay_producer", "sequence_id").collect()
    by_producer: dict[str, list[int]] = {}
    for row in sending:
        by_producer.setdefault(row["replay_producer"], []).append(row["sequence_id"])
    assert 1 <= len(by_producer) <= 3
    for name, seqs in by_producer.items():
        assert name.startswith("dlq-replay-")
        assert sorted(seqs) == list(range(len(seqs)))
    # Deterministic: deciding again gives the same producer and sequence per message.
    again = decide(snap, PLAYBOOK, settings(), producers_per_target=3)
    key = ["replay_id", "replay_producer", "sequence_id"]
    assert sorted(map(tuple, again.select(key).collect())) == sorted(
        map(tuple, decided.select(key).collect())
    )


def scope_counts(snap, filters, final=None, column="outcome"):
    return counts(decide(snap, PLAYBOOK, settings(), 2, filters=filters, final_ids=final), column)


def test_filters_and_max_messages(spark):
    snap = snapshot_df(spark)
    sig = decide(snap, PLAYBOOK, settings(), 2).filter("error_class = 'Poison'").first()["signature"]
    assert scope_counts(snap, Filters(signatures=(sig,))) == {oc.ARCHIVED: 6, oc.FILTERED: 43}
    both = Filters(error_class="Timeout", since=T0 + timedelta(minutes=10))
    assert scope_counts(snap, both) == {oc.TO_REPUBLISH: 30, oc.FILTERED: 19}
    early = scope_counts(snap, Filters(until=T0 + timedelta(minutes=5)))
    assert early[oc.TO_REPUBLISH] + early[oc.MALFORMED] == 5 + 3  # junk rows are published at T0
    limited = decide(snap, PLAYBOOK, settings(), 2, filters=Filters(error_class="Timeout", max_messages=7))
    chosen = limited.filter("outcome != 'filtered'").select("dlq_message_id").collect()
    assert sorted(int(r[0].split(":")[1]) for r in chosen) == list(range(7))  # oldest first
    reasons = counts(limited, "outcome_reason")
    assert reasons["beyond --max-messages"] == 33
    assert reasons["not selected by --error-class"] == 9


def test_archive_ledger_and_already_final(spark, tmp_path):
    snap = snapshot_df(spark)
    decided = decide(snap, PLAYBOOK, settings(), 2)
    archive_root = str(tmp_path / "archive")
    for _ in range(2):  # a redone decide and apply replace this run's partitions
        write_archive(decided, tmp_path, archive_root, "run-1")
    archived = spark.read.parquet(archive_root)
    assert archived.count() == 6
    first = archived.first()
    assert first["payload"] is None
    assert first["payload_archived"] is False
    assert len(first["payload_sha256"]) == 64
    assert first["dlq_topic"] == DLQ
    assert first["run_id"] == "run-1"
    assert str(first["date"]) == "2024-05-01"
    assert first["error_class"] == "Poison"
    assert first["archive_reason"] == "rule 'archive-poison' says archive"

    published = spark.createDataFrame(
        [
            (r["replay_id"], True, "9:9:-1:-1", None)
            for r in decided.filter("outcome='to_republish'").collect()
        ],
        "replay_id string, published boolean, published_message_id string, error string",
    )
    outcomes_df = with_publish_results(decided, published.limit(39))  # one send has no result
    assert counts(outcomes_df) == {oc.REPUBLISHED: 39, oc.PUBLISH_FAILED: 1, oc.ARCHIVED: 6, oc.MALFORMED: 3}
    ledger_root = str(tmp_path / "ledger")
    for _ in range(2):  # a redone record step rewrites, never duplicates
        record_ledger(
            ledger_rows(outcomes_df, "manual__2024-05-01T00:00:00+00:00", oc.REPLAY, T0),
            tmp_path,
            ledger_root,
        )
    ledger = read_ledger(spark, RunStorage(), ledger_root)
    assert ledger.schema == LEDGER_SCHEMA
    assert ledger.count() == 49
    assert ledger.filter("final").count() == 45
    assert {r["run_id"] for r in ledger.select("run_id").distinct().collect()} == {
        "manual__2024-05-01T00:00:00+00:00"
    }
    # A later run sees those 45 as already final, whatever its filters.
    ids = final_ids(ledger, exclude_run_id="run-2")
    assert scope_counts(snap, Filters(signatures=("none",)), ids) == {oc.ALREADY_FINAL: 45, oc.FILTERED: 4}
    assert final_ids(ledger, exclude_run_id="manual__2024-05-01T00:00:00+00:00").count() == 0
    assert read_ledger(spark, RunStorage(), str(tmp_path / "none")) is None


def test_report_from_outcomes(spark):
    snap = snapshot_df(spark, n_timeout=12, n_poison=2, n_junk=1)
    decided = decide(snap, PLAYBOOK, settings(oc.DRY_RUN), 2)
    parts = spark_parts(dry_run_outcomes(decided), decided)
    report = build_report(
        parts, run_id="r", mode=oc.DRY_RUN, status="succeeded", started_at="a", finished_at="b",
        commit=CommitTotals(), timings={}, paths={},
    )  # fmt: skip
    t = report["totals"]
    assert (t["snapshot"], t[oc.REPUBLISHED], t[oc.ARCHIVED], t[oc.MALFORMED], t["left_pending"]) == (
        15,
        12,
        2,
        1,
        15,
    )
    big = report["groups"][0]
    assert big["count"] == 12
    assert big["template"] == "failed <num>"
    assert big["action"] == "republish"
    assert big["sample_message_ids"] == [f"1:{i}:-1:-1" for i in range(5)]
    assert big["first_seen"] == "2024-05-01T00:00:00.000Z"
    assert sum(g["count"] for g in report["groups"]) == 15


def test_report_samples_are_a_signatures_first_messages_across_its_outcomes(spark):
    """The reference aggregation the record tasks' parts are compared with: a group's sample ids are its
    first messages by (publish time, topic, id), nulls first, wherever they fall among its (outcome,
    action, rule) combinations."""
    from spark_apps.dlq_replay.report_parts import SAMPLE_IDS

    columns = (
        "signature string, outcome string, action string, rule string, error_template string, "
        "error_class string, origin_topic string, context_format string, reason string, "
        "publish_time timestamp, dlq_topic string, dlq_message_id string"
    )
    rows = []
    for i in range(9):  # outcomes alternate; two topics tie on every other publish time
        outcome = oc.REPUBLISHED if i % 2 else oc.PUBLISH_FAILED
        at = None if i == 7 else T0 + timedelta(seconds=i // 2)
        topic = DLQ if i % 3 else DLQ_B
        rows.append(("s", outcome, "republish", "r", "t", "E", "o", "f", "term", at, topic, f"1:{i}:-1:-1"))
    rows.append(("other", oc.ARCHIVED, "archive", "a", "t", "E", "o", "f", "term", T0, DLQ, "2:0:-1:-1"))
    combos, samples = aggregate(spark.createDataFrame(rows, columns).repartition(3))
    assert sorted((c["signature"], c["outcome"], c["n"]) for c in combos) == [
        ("other", oc.ARCHIVED, 1), ("s", oc.PUBLISH_FAILED, 5), ("s", oc.REPUBLISHED, 4)
    ]  # fmt: skip
    assert "first_ids" not in combos[0]

    def first(row):
        return (row[9] is not None, row[9] or T0, row[10], row[11])

    expected = [r[11] for r in sorted((r for r in rows if r[0] == "s"), key=first)][:SAMPLE_IDS]
    assert expected[0] == "1:7:-1:-1"  # the message without a publish time comes first
    assert samples == {"s": expected, "other": ["2:0:-1:-1"]}


DLQ_B = "persistent://public/default/orders-other-DLQ"


def copies_df(spark, copies):
    """Snapshot rows ``(key, dlq topic, message id, minutes after T0, origin message id)``."""
    rows = []
    for key, topic, msg_id, minutes, origin_id in copies:
        props = {**props_of("Timeout"), "ORIGIN_MESSAGE_ID": origin_id}
        when = T0 + timedelta(minutes=minutes)
        rows.append((topic, -1, msg_id.encode(), msg_id, key, None, b"payload", props, when, None, 0, "p", 1))
    return spark.createDataFrame(rows, SNAPSHOT_SCHEMA)


def props_of(cls):
    return props(cls)


def by_key(df):
    return {r["key"]: r for r in df.collect()}


COPIES = [
    # Original A: three copies in two DLQ topics; the oldest (a-old, in DLQ_B) wins.
    ("a-late", DLQ, "1:1:-1:-1", 5, "(9,1,-1,-1)"),
    ("a-old", DLQ_B, "2:7:-1:-1", 1, "9:1:-1"),
    ("a-same-time", DLQ, "1:0:-1:-1", 1, "9:1:-1:-1"),
    # Original B: two copies published at the same time: the smaller topic, then message id, wins.
    ("b-1", DLQ, "1:3:-1:-1", 2, "9:2:-1:-1"),
    ("b-2", DLQ, "1:2:-1:-1", 2, "9:2:-1:-1"),
    # Original C: one copy.
    ("c", DLQ, "1:4:-1:-1", 3, "9:3:-1:-1"),
]


def test_one_republish_per_original_within_a_run_across_topics_and_across_runs(spark, tmp_path):
    snap = copies_df(spark, COPIES)
    outcomes = {}
    for partitions in (1, 3, 5):  # the winner never depends on how the snapshot is split (resume)
        decided = by_key(decide(snap.repartition(partitions), PLAYBOOK, settings(), 2))
        outcomes[partitions] = {k: r["outcome"] for k, r in decided.items()}
    assert outcomes[1] == outcomes[3] == outcomes[5]
    # a-old and a-same-time share the oldest time: DLQ_B ("orders-other-DLQ") sorts before DLQ.
    assert outcomes[1] == {
        "a-old": oc.TO_REPUBLISH, "a-same-time": oc.DUPLICATE, "a-late": oc.DUPLICATE,
        "b-2": oc.TO_REPUBLISH, "b-1": oc.DUPLICATE, "c": oc.TO_REPUBLISH,
    }  # fmt: skip
    assert decided["a-late"]["replay_id"] == decided["a-old"]["replay_id"]
    assert decided["a-late"]["outcome_reason"] == (
        f"another copy of the same original ({DLQ_B} 2:7:-1:-1) is in this run and was published first"
    )
    assert decided["a-late"]["replay_producer"] is None
    # --max-messages counts originals, not copies.
    limited = by_key(decide(snap, PLAYBOOK, settings(), 2, filters=Filters(max_messages=2)))
    assert sorted(k for k, r in limited.items() if r["outcome"] == oc.TO_REPUBLISH) == ["a-old", "b-2"]
    assert limited["c"]["outcome_reason"] == "beyond --max-messages"

    # Run 1 records its outcomes; run 2 sees one copy again (batch redelivery) and two new copies.
    sent = spark.createDataFrame(
        [
            (r["replay_id"], True, "9:9:-1:-1", None)
            for r in decided.values()
            if r["outcome"] == oc.TO_REPUBLISH
        ],
        "replay_id string, published boolean, published_message_id string, error string",
    )
    first = decide(snap, PLAYBOOK, settings(), 2)
    ledger_root = str(tmp_path / "ledger")
    record_ledger(
        ledger_rows(with_publish_results(first, sent), "run-1", oc.REPLAY, T0), tmp_path, ledger_root
    )
    ledger = read_ledger(spark, RunStorage(), ledger_root)
    later = copies_df(
        spark,
        [
            ("a-old", DLQ_B, "2:7:-1:-1", 1, "9:1:-1"),  # the same DLQ message: already final
            ("a-4th", DLQ_B, "2:9:-1:-1", 9, "9:1:-1"),  # a new copy of A: duplicate
            ("d", DLQ_B, "2:10:-1:-1", 9, "9:4:-1"),  # a new original
        ],
    )
    second = by_key(
        decide(later, PLAYBOOK, settings(), 2, final_ids=final_ids(ledger, exclude_run_id="run-2"))
    )
    assert {k: r["outcome"] for k, r in second.items()} == {
        "a-old": oc.ALREADY_FINAL, "a-4th": oc.DUPLICATE, "d": oc.TO_REPUBLISH,
    }  # fmt: skip
    assert second["a-old"]["outcome_reason"] == "final in the ledger of run run-1"
    assert second["a-4th"]["outcome_reason"] == (
        f"another copy of the same original ({DLQ_B} 2:7:-1:-1) is final in the ledger of run run-1"
    )
    recorded = read_ledger(spark, RunStorage(), ledger_root)
    assert recorded.filter("outcome = 'duplicate' AND final").count() == 3


def test_the_replay_ids_in_the_snapshot_files_are_the_normalised_ones_and_copies_rank_alone(spark, tmp_path):
    snapshot = str(tmp_path / "snapshot")
    tallies = write_snapshot(copies_df(spark, COPIES).repartition(3), snapshot)
    identities = spark.read.schema(IDENTITIES_SCHEMA).parquet(snapshot)
    assert sum(t[0] for t in tallies) == identities.count() == len(COPIES)
    # Each row's id as the read task wrote it is the one the context parser gives the row.
    for path in task_parquet.part_files(snapshot):
        for batch in pq.read_table(path).to_batches():
            found = normalize_columns(batch)["replay_id"]
            assert batch.column(REPLAY_ID_MARK).to_pylist() == found.to_pylist()
    snap = spark.read.schema(SNAPSHOT_SCHEMA).parquet(snapshot)
    read_df = decide(snap, PLAYBOOK, settings(), 2)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(scope, "REPEATED_LIMIT", 0)  # every row is ranked
        ranked_df = decide(snap, PLAYBOOK, settings(), 2)
    # Ranking only the copies' rows decides as ranking every row.
    assertDataFrameEqual(read_df, ranked_df)
    read = by_key(read_df)
    # Python tasks find the replay ids of copies (by hash share); only their rows are ranked.
    for tasks in (1, 3):
        assert repeated_ids(spark, snapshot, tasks) == {read[k]["replay_id"] for k in ("a-old", "b-1")}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(scope, "REPEATED_LIMIT", 1)
        assert repeated_ids(spark, snapshot, 2) is None  # more than the limit: every row is ranked
    assert sorted(r["outcome"] for r in read.values()).count(oc.DUPLICATE) == 3


def test_a_snapshot_without_copies_needs_no_marks(spark, tmp_path):
    """Replay ids without a repeated one: no scope marks and no Spark job for them; with an earlier run's
    final rows the ledger still marks its messages (already final, or another copy final)."""
    snapshot = str(tmp_path / "snapshot")
    single = [c for c in COPIES if c[0] in ("a-old", "b-2", "c")]
    snap = copies_df(spark, single)
    write_snapshot(snap.repartition(2), snapshot)
    identities = spark.read.schema(IDENTITIES_SCHEMA).parquet(snapshot)
    assert repeated_ids(spark, snapshot, 2) == set()
    jobs = spark.sparkContext.statusTracker()
    before = len(jobs.getJobIdsForGroup(None))
    marked, count = scope_marks(snap, Filters(), None, identities=identities, repeated=set())
    assert len(jobs.getJobIdsForGroup(None)) == before
    assert count == 0
    assert marked.collect() == []
    expected = by_key(decide(snap, PLAYBOOK, settings(), 2))
    assert {k: r["outcome"] for k, r in expected.items()} == {
        "a-old": oc.TO_REPUBLISH, "b-2": oc.TO_REPUBLISH, "c": oc.TO_REPUBLISH,
    }  # fmt: skip
    # An earlier run made a-old final: with the ledger, it is already final and a new copy of it a
    # duplicate, whether or not the snapshot itself holds copies.
    sent = spark.createDataFrame(
        [(r["replay_id"], True, "9:9:-1:-1", None) for k, r in expected.items() if k == "a-old"],
        "replay_id string, published boolean, published_message_id string, error string",
    )
    ledger_root = str(tmp_path / "ledger")
    first = decide(snap, PLAYBOOK, settings(), 2).filter("key = 'a-old'")
    record_ledger(
        ledger_rows(with_publish_results(first, sent), "run-1", oc.REPLAY, T0), tmp_path, ledger_root
    )
    earlier = final_ids(read_ledger(spark, RunStorage(), ledger_root), exclude_run_id="run-2")
    second = by_key(decide(snap, PLAYBOOK, settings(), 2, final_ids=earlier))
    assert {k: r["outcome"] for k, r in second.items()} == {
        "a-old": oc.ALREADY_FINAL, "b-2": oc.TO_REPUBLISH, "c": oc.TO_REPUBLISH,
    }  # fmt: skip


def test_storage_round_trip(spark, tmp_path):
    storage = RunStorage()
    path = str(tmp_path / "runs" / "r" / "state.json")
    assert storage.read_text(path) is None
    storage.write_text(path, "héllo")
    storage.write_text(path, "again")
    assert storage.read_text(path) == "again"
    assert sorted(p.name for p in (tmp_path / "runs" / "r").iterdir()) == ["state.json"]


def write_archive(decided, tmp_path, archive_root: str, run_id: str) -> None:
    """The archive as a run writes it: staged by the decide tasks, moved into place by apply."""
    from spark_apps.dlq_replay.archive_files import publish_staged, staged_output
    from spark_apps.dlq_replay.schemas import DECIDED_SCHEMA

    task_parquet.write_in_tasks(
        decided,
        lambda batches: batches,
        DECIDED_SCHEMA,
        str(tmp_path / "decisions"),
        lambda batch: (batch.num_rows,),
        ("n",),
        [staged_output(str(tmp_path / "staged"), T0)],
    )
    assert publish_staged(str(tmp_path / "staged"), archive_root, "2024-05-01", run_id) == 1
    assert publish_staged(str(tmp_path / "staged"), archive_root, "2024-05-01", run_id) == 0


def record_ledger(rows, tmp_path, ledger_root: str) -> None:
    """Ledger rows computed by Spark (the reference the record tasks' rows are compared with), staged and
    moved into the ledger as the record step moves its own."""
    from spark_apps.dlq_replay.record import publish_staged

    staged = str(tmp_path / "ledger_staged")
    run_id = rows.select("run_id").first()["run_id"]
    write_ledger(rows, staged)
    assert publish_staged(staged, ledger_root, run_id)


def test_archive_folders_are_sparks_partition_folders(spark, tmp_path):
    """The archive's partition folders escape as Spark's do, and Spark reads its INT96 timestamps."""
    decided = decide(snapshot_df(spark, n_timeout=5), PLAYBOOK, settings(), 2)
    run_id = "manual__2024-05-01T00:00:00+00:00"  # ':' and '+' as Airflow run ids have them
    root = tmp_path / "archive"
    write_archive(decided, tmp_path, str(root), run_id)
    folders = sorted(str(p.parent.relative_to(root)) for p in root.rglob("*.parquet"))
    assert folders[0] == (
        "dlq_topic=persistent%3A%2F%2Fpublic%2Fdefault%2Forders-sub-DLQ/date=2024-05-01/"
        "run_id=manual__2024-05-01T00%3A00%3A00+00%3A00"
    )
    archived = spark.read.parquet(str(root))
    assert {r["run_id"] for r in archived.select("run_id").collect()} == {run_id}
    assert dict(archived.dtypes)["archived_at"] == "timestamp"


def recorded_inputs(spark, tmp_path):
    """Decisions written one file per bucket and the send results of every wave (waves of 3 sequence
    ids per producer), as the decide and send tasks leave them: copies of one original in both buckets,
    a failed send in bucket 0, a send without a result in bucket 1. Returns (snapshot, decided, decisions
    folder, results folder)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from spark_apps.dlq_replay.schemas import DECIDED_SCHEMA

    snap = copies_df(spark, COPIES).unionByName(snapshot_df(spark, n_timeout=9, n_poison=2, n_junk=1))
    decided = decide(snap, PLAYBOOK, settings(), 2).cache()
    decisions, results = tmp_path / "decisions", tmp_path / "republish"
    task_parquet.write_in_tasks(
        decided, lambda batches: batches, DECIDED_SCHEMA, str(decisions), lambda b: (b.num_rows,), ("n",)
    )
    result_type = pa.schema(
        [("replay_id", pa.string()), ("published", pa.bool_()), ("published_message_id", pa.string()),
         ("error", pa.string()), ("row", pa.int64())]
    )  # fmt: skip
    for bucket in (0, 1):  # what the send tasks save, in waves of 3 sequence ids per producer
        columns = ["replay_id", "outcome", "sequence_id"]
        rows = pq.read_table(task_parquet.part_file(str(decisions), bucket), columns=columns).to_pylist()
        sent = [{**r, "row": n} for n, r in enumerate(rows) if r["outcome"] == oc.TO_REPUBLISH]
        assert sent, "each bucket sends something"
        saved = [
            (r, (r["replay_id"], True, f"{bucket}:{i}:-1:-1", None, r["row"])) for i, r in enumerate(sent)
        ]
        if bucket == 0:
            saved[0] = (sent[0], (sent[0]["replay_id"], False, None, "topic terminated", sent[0]["row"]))
        else:
            saved.pop()  # its wave was cut short: no result
        for wave in sorted({r["sequence_id"] // 3 for r in sent}):
            folder = results / f"wave={wave}"
            folder.mkdir(parents=True, exist_ok=True)
            mine = [
                dict(zip(result_type.names, out, strict=True))
                for r, out in saved
                if r["sequence_id"] // 3 == wave
            ]
            pq.write_table(
                pa.Table.from_pylist(mine, result_type), task_parquet.part_file(str(folder), bucket)
            )
    return snap, decided, decisions, results


def test_ledger_recorded_by_tasks_reads_as_sparks_ledger(spark, tmp_path):
    """The record tasks (each bucket's decisions file zipped with its send results of every wave, moved
    into the ledger) give the rows, schema, folder and Parquet types of Spark's join and writer: copies of
    one original in both buckets, a failed send, a send without a result, two waves."""
    import pyarrow.parquet as pq

    from spark_apps.dlq_replay.record import RecordTask, publish_staged, record_in_tasks

    _, decided, decisions, results = recorded_inputs(spark, tmp_path)
    run_id = "manual__2024-05-01T00:00:00+00:00"
    by_spark, by_tasks = tmp_path / "spark", tmp_path / "tasks"
    outcomes_df = with_publish_results(decided.select(*OUTCOME_COLUMNS), spark.read.parquet(str(results)))
    record_ledger(ledger_rows(outcomes_df, run_id, oc.REPLAY, T0), tmp_path / "a", str(by_spark))
    record_ledger(ledger_rows(outcomes_df, "run-0", oc.REPLAY, T0), tmp_path / "b", str(by_tasks))
    staged = str(tmp_path / "ledger_staged")
    for _ in range(2):  # a redone record step replaces this run's partition
        parts, commits = str(tmp_path / "report_parts"), str(tmp_path / "commit_parts")
        task = RecordTask(str(decisions), str(results), parts, commits, oc.REPLAY, T0, batch_rows=4)
        written = record_in_tasks(spark, task, 2, staged)
        assert written == decided.count() == 18
        assert publish_staged(staged, str(by_tasks), run_id)
    assert not publish_staged(staged, str(by_tasks), run_id)

    expected = read_ledger(spark, RunStorage(), str(by_spark)).filter(f"run_id = '{run_id}'")
    actual = read_ledger(spark, RunStorage(), str(by_tasks)).filter(f"run_id = '{run_id}'")
    assertDataFrameEqual(actual, expected)
    # The Timeout rows 1:0 to 1:4 of snapshot_df are more copies of the originals of COPIES.
    assert counts(actual) == {
        oc.REPUBLISHED: 7, oc.PUBLISH_FAILED: 2, oc.DUPLICATE: 6, oc.ARCHIVED: 2, oc.MALFORMED: 1,
    }  # fmt: skip
    failed = sorted(r["outcome_reason"] for r in actual.filter("outcome = 'publish_failed'").collect())
    assert failed == ["publish failed: no send result", "publish failed: topic terminated"]
    ids = actual.filter("published_message_id IS NOT NULL").select("outcome").distinct().collect()
    assert [r[0] for r in ids] == [oc.REPUBLISHED]  # not the other copies of a republished original
    assert read_ledger(spark, RunStorage(), str(by_tasks)).filter("run_id = 'run-0'").count() == 18
    partition = by_tasks / "run_id=manual__2024-05-01T00%3A00%3A00+00%3A00"
    assert sorted(p.name for p in partition.iterdir()) == ["part-00000.parquet", "part-00001.parquet"]
    assert (by_tasks / "_SUCCESS").exists()

    def parquet_types(root):
        schema = pq.ParquetFile(next(root.rglob("*.parquet"))).schema
        return [(c.path, c.physical_type, str(c.logical_type)) for c in schema]

    assert parquet_types(partition) == parquet_types(by_spark)


@pytest.mark.parametrize("snippets", [False, True])
def test_report_from_record_parts_is_sparks_report(spark, tmp_path, snippets):
    """The report built from the record tasks' parts (groups, samples, representatives with their
    properties and payload snippets) is the one Spark's aggregation of the ledger and its queries build;
    its trend reads only the earlier run from the ledger and puts this run last, at its ledger time."""
    from types import SimpleNamespace

    from spark_apps.dlq_replay.record import RecordTask, publish_staged, record_in_tasks
    from spark_apps.dlq_replay.report import ReportContext, add_details
    from spark_apps.dlq_replay.report_parts import read_parts

    snap, decided, decisions, results = recorded_inputs(spark, tmp_path)
    snapshot, ledger, parts = (str(tmp_path / name) for name in ("snapshot", "ledger", "report_parts"))
    snap.write.parquet(snapshot)
    staged = str(tmp_path / "ledger_staged")
    commits = str(tmp_path / "commit_parts")
    task = RecordTask(str(decisions), str(results), parts, commits, oc.REPLAY, T0, batch_rows=4)
    record_in_tasks(spark, task, 2, staged)
    publish_staged(staged, ledger, "run-1")
    earlier = decided.filter("outcome = 'to_republish'").select(*OUTCOME_COLUMNS)
    record_ledger(
        ledger_rows(with_publish_results(earlier, None), "run-0", oc.REPLAY, T0 - timedelta(days=1)),
        tmp_path / "run-0",
        ledger,
    )
    options = SimpleNamespace(archive_payload=True)
    context = ReportContext(
        options, PLAYBOOK, str(decisions), snapshot, ledger, payload_snippets=snippets, recorded_at=T0
    )

    def report(from_parts):
        built = build_report(
            from_parts, run_id="run-1", mode=oc.REPLAY, status="succeeded", started_at="a", finished_at="b",
            commit=CommitTotals(), timings={}, paths={},
        )  # fmt: skip
        add_details(built, spark, context, from_parts)
        return built

    outcomes = read_ledger(spark, RunStorage(), ledger).filter("run_id = 'run-1'")
    by_spark, by_parts = report(spark_parts(outcomes, decided)), report(read_parts(parts))
    assert by_parts == by_spark
    groups = by_parts["groups"]
    # The sample errors came from the parts and one counting pass (copies of one failure share a message).
    assert read_parts(parts).errors
    assert any(error["count"] > 1 for g in groups for error in g["sample_errors"])
    assert sum(g["count"] for g in groups) == decided.count() == 18
    # The trend reads the earlier run from the ledger; this run comes last, at its ledger time.
    this_run = read_ledger(spark, RunStorage(), ledger).filter("run_id = 'run-1'")
    at = this_run.agg({"recorded_at": "max"}).collect()[0][0].isoformat()
    assert [(r["run_id"], r["messages"]) for r in by_parts["trend"]["runs"]] == [("run-0", 9), ("run-1", 18)]
    assert by_parts["trend"]["runs"][-1]["at"] == at
    trend_counts = {g["signature"]: g["counts"] for g in by_parts["trend"]["groups"]}
    sent = {
        g["signature"]: sum(g["outcomes"].get(o, 0) for o in (oc.REPUBLISHED, oc.PUBLISH_FAILED))
        for g in groups
    }
    assert trend_counts == {g["signature"]: [sent[g["signature"]], g["count"]] for g in groups}
    assert by_parts["totals"][oc.PUBLISH_FAILED] == 2
    assert all(g["sample_message_ids"] and g["explanation"]["message_id"] for g in groups)
    with_props = [g for g in groups if g["explanation"].get("rules")]
    assert with_props, "the playbook was applied to some representative"
    if snippets:
        assert all(len(g["payload_samples"]) == min(2, g["count"]) for g in groups)


def test_fix_errors_are_a_groups_most_frequent_first_counted_over_the_decisions(spark, tmp_path):
    """Per shown group, its FIX_ERRORS most frequent fix errors (ties by text), cut to ERROR_CHARS; groups
    not shown are not counted (in Python tasks, one per decisions file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from spark_apps.dlq_replay.report import _errors
    from spark_apps.dlq_replay.report_parts import ERROR_CHARS, ReportParts
    from spark_apps.dlq_replay.task_parquet import part_file

    fixes = [("s", "e2")] * 3 + [("s", "e1")] * 3 + [("s", "e3")] * 2 + [("s", "e4"), ("s", None)]
    fixes += [("t", "y" * 600), ("u", "z")]
    (tmp_path / "decisions").mkdir()
    for bucket, rows in enumerate((fixes[:5], fixes[5:])):
        signatures, errors = zip(*rows, strict=True)
        messages = pa.nulls(len(rows), pa.string())
        table = pa.table({"signature": signatures, "error_message": messages, "fix_error": errors})
        pq.write_table(table, part_file(str(tmp_path / "decisions"), bucket))
    parts = ReportParts([], {}, [], {})
    fix_errors, sample_errors = _errors(spark, parts, str(tmp_path / "decisions"), ["s", "t"])
    assert fix_errors == {
        "s": [{"error": "e1", "count": 3}, {"error": "e2", "count": 3}, {"error": "e3", "count": 2}],
        "t": [{"error": "y" * ERROR_CHARS, "count": 1}],
    }
    assert sample_errors == {}


def test_sending_targets_are_read_by_tasks_over_every_decisions_file(spark, tmp_path):
    """The distinct targets of rows to republish over all decisions files (a refused row's is not one)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from spark_apps.dlq_replay.task_parquet import part_file
    from spark_apps.dlq_replay.task_sends import sending_targets

    files = [
        [(oc.TO_REPUBLISH, "persistent://t/n/a"), (oc.ORIGIN_REFUSED, "persistent://t/n/admin")],
        [
            (oc.TO_REPUBLISH, "persistent://t/n/b"),
            (oc.TO_REPUBLISH, "persistent://t/n/a"),
            (oc.ARCHIVED, None),
        ],
    ]
    for bucket, rows in enumerate(files):
        outcomes, targets = zip(*rows, strict=True)
        table = pa.table({"outcome": outcomes, "target_topic": pa.array(targets, pa.string())})
        pq.write_table(table, part_file(str(tmp_path), bucket))
    assert sending_targets(spark, str(tmp_path)) == {"persistent://t/n/a", "persistent://t/n/b"}
    assert sending_targets(spark, str(tmp_path / "none")) == set()
