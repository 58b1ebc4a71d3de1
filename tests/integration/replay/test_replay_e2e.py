"""End to end on Apache Pulsar and local Spark, runner in-process (the spark-submit runs are in
test_replay_submit.py): dry-run, replay, re-runs, late arrivals, forged origin, loop guard."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from replay_e2e_support import (
    PLAYBOOK,
    build_mixed_dlq,
    close_driver_clients,
    drain,
    expected_totals,
    ours,
    pending_keys,
    produce_late,
)

from pulsar_dlq_consumer.replay_options import DEDUP_WAVE_SIZE
from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay.options import ReplayOptions
from spark_apps.dlq_replay.runner import run_replay

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True, scope="module")
def _close_clients_after_module():
    yield
    close_driver_clients()


PENDING = (oc.SKIPPED, oc.FIX_FAILED, oc.MALFORMED, oc.ORIGIN_REFUSED)
FINAL = (oc.REPUBLISHED, oc.ARCHIVED, oc.DROPPED, oc.LOOP_GUARDED)


def options(mixed, out: Path, run_id: str, mode: str, broker, *, reader: bool = True, **kw) -> ReplayOptions:
    """Options of a run on ``broker``: its admin URL selects the reader mode (``reader=False``: the
    consumer mode Apache Pulsar falls back to without an admin URL)."""
    return ReplayOptions(
        run_id=run_id,
        mode=mode,
        service_url=broker.service_url,
        admin_url=broker.admin_url if reader else None,
        topics=(mixed.dlq_a, mixed.dlq_b),
        output_dir=str(out),
        playbook=PLAYBOOK,
        origin_allowlist=("orders-*",),
        idle_timeout_ms=1500,
        **kw,
    )


def totals_of(report, *names):
    return {n: report["totals"][n] for n in names if report["totals"][n]}


def test_mixed_dlq_dry_run_then_replay_then_reruns(spark, pulsar_client, pulsar_broker, tmp_path):
    mixed = build_mixed_dlq(pulsar_client, per_kind=4)
    everything = sorted(mixed.expected)
    out = tmp_path / "out"

    # ---- dry-run: decides and reports, changes nothing.
    dry = run_replay(spark, options(mixed, out, "dry-1", oc.DRY_RUN, pulsar_broker))
    want = expected_totals(mixed)
    assert dry["status"] == "succeeded"
    assert dry["dry_run"] is True
    assert totals_of(dry, *FINAL, *PENDING) == want
    assert dry["totals"]["snapshot"] == len(everything)
    assert dry["totals"]["acked"] == 0
    assert pending_keys(pulsar_client, mixed) == everything
    assert drain(pulsar_client, [mixed.orders, mixed.admin], "verify-dry", idle_ms=800) == []
    assert not (out / "ledger").exists()
    assert not (out / "archive").exists()
    assert (out / "runs" / "dry-1" / "report.html").read_text().startswith("<!DOCTYPE html>")

    # ---- replay, with late messages arriving after the window was frozen (I3).
    late: list[str] = []

    def produce_after_plan() -> None:
        state = out / "runs" / "run-1" / "state.json"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if state.exists() and '"plan"' in state.read_text() and "complete" in state.read_text():
                late.extend(produce_late(pulsar_client, mixed, 3))
                return
            time.sleep(0.05)

    producer_thread = threading.Thread(target=produce_after_plan)
    producer_thread.start()
    report = run_replay(spark, options(mixed, out, "run-1", oc.REPLAY, pulsar_broker))
    producer_thread.join()
    assert len(late) == 3
    assert report["status"] == "succeeded"
    # Apache Pulsar with its admin REST: each DLQ message read once (snapshot), acked by id (commit).
    assert report["commit"]["read_mode"] == "reader"
    assert report["commit"]["reads_per_message"] == 1.0
    assert report["commit"]["beyond_window"] == 3  # the late arrivals (one entry each)
    assert totals_of(report, *FINAL, *PENDING) == want
    assert report["totals"]["snapshot"] == len(everything)  # late ones are beyond the window
    final = mixed.keys(*FINAL)
    assert report["totals"]["acked"] == len(final)
    assert report["totals"]["left_pending"] == len(everything) - len(final)
    # Groups add up, and every group has a template and samples.
    assert sum(g["count"] for g in report["groups"]) == len(everything)
    assert all(g["sample_message_ids"] for g in report["groups"])
    on_disk = json.loads((out / "runs" / "run-1" / "report.json").read_text())
    assert on_disk["totals"] == report["totals"]

    # Republished: exactly the fixed and as-is ones, once each, with lineage; nothing to the forged origin.
    replayed = drain(pulsar_client, mixed.orders, "verify-1")
    assert sorted(m.partition_key() for m in replayed) == sorted(mixed.keys(oc.REPUBLISHED))
    for msg in replayed:
        props = msg.properties()
        assert props["REPLAY_RUN_ID"] == "run-1"
        assert props["REPLAY_COUNT"] == "1"
        assert props["REPLAYED_FROM"] in (mixed.dlq_a, mixed.dlq_b)
        assert len(props["REPLAY_ID"]) == 32
        assert not any(
            k.startswith(("__dlq.errors.", "__connect.errors.")) or k == "REAL_TOPIC" for k in props
        )
        key = msg.partition_key()
        if key.startswith("fix-"):
            body = json.loads(msg.data())
            assert body["currency"] == "EUR"
            assert props["orders.currency-defaulted"] == "true"
            assert props["REPLAY_FIX"] == "orders_fixes:add_default_currency@1"
        else:
            assert msg.data() == mixed.payloads[key]
            assert props["REPLAY_FIX"] == ""
    assert len({m.properties()["REPLAY_ID"] for m in replayed}) == len(replayed)
    assert drain(pulsar_client, mixed.admin, "verify-1", idle_ms=800) == []

    # Pending: skipped, fix_failed, malformed, refused (I4) and the late arrivals (I3).
    assert pending_keys(pulsar_client, mixed) == sorted(mixed.keys(*PENDING) | set(late))

    # Archive and ledger.
    archived = spark.read.parquet(str(out / "archive"))
    assert sorted(r["key"] for r in archived.select("key").collect()) == sorted(
        mixed.keys(oc.ARCHIVED, oc.LOOP_GUARDED)
    )
    assert archived.filter("outcome = 'loop_guarded'").count() == len(mixed.keys(oc.LOOP_GUARDED))
    ledger = spark.read.parquet(str(out / "ledger"))
    assert ledger.count() == len(everything)
    assert ledger.filter("final").count() == len(final)

    # ---- the same run id again: complete, nothing redone.
    again = run_replay(spark, options(mixed, out, "run-1", oc.REPLAY, pulsar_broker))
    assert again["totals"] == report["totals"]
    assert len(drain(pulsar_client, mixed.orders, "verify-1b")) == len(replayed)

    # ---- a new run: picks up the late ones, re-decides the pending ones, doubles nothing (I2).
    second = run_replay(spark, options(mixed, out, "run-2", oc.REPLAY, pulsar_broker))
    assert second["totals"]["snapshot"] == len(mixed.keys(*PENDING)) + len(late)
    assert second["totals"][oc.REPUBLISHED] == len(late)
    assert second["totals"][oc.ALREADY_FINAL] == 0
    replayed2 = drain(pulsar_client, mixed.orders, "verify-2")
    keys2 = sorted(m.partition_key() for m in replayed2)
    assert keys2 == sorted(mixed.keys(oc.REPUBLISHED) | set(late))
    assert pending_keys(pulsar_client, mixed) == sorted(mixed.keys(*PENDING))
    ledger = spark.read.parquet(str(out / "ledger"))  # one row per message per run
    assert ledger.count() == len(everything) + len(mixed.keys(*PENDING)) + len(late)
    finals = ledger.filter("final").select("replay_id")
    assert finals.count() == finals.distinct().count() == len(final) + len(late)


def test_archive_only_and_filters(spark, pulsar_client, pulsar_broker, tmp_path):
    mixed = build_mixed_dlq(pulsar_client, per_kind=2)
    out = tmp_path / "out"
    # The consumer mode (no admin URL), two consumers per DLQ partition: a message one of them releases
    # may reach the other; the snapshot still holds every message once.
    report = run_replay(
        spark,
        options(
            mixed,
            out,
            "ao-1",
            oc.ARCHIVE_ONLY,
            pulsar_broker,
            reader=False,
            error_class="JSONDecodeError",
            parallelism=2,
        ),
    )
    assert report["commit"]["read_mode"] == "consumer"
    assert report["commit"]["reads_per_message"] > 1.0  # the commit reads the topics it acks on again
    assert report["totals"]["snapshot"] == len(mixed.expected)
    assert report["totals"][oc.ARCHIVED] == len(mixed.keys(oc.ARCHIVED))
    assert report["totals"][oc.REPUBLISHED] == 0
    assert report["totals"][oc.DROPPED] == 0
    assert report["totals"][oc.FILTERED] == len(mixed.expected) - len(mixed.keys(oc.ARCHIVED))
    assert drain(pulsar_client, mixed.orders, "verify-ao", idle_ms=800) == []
    assert pending_keys(pulsar_client, mixed) == sorted(set(mixed.expected) - mixed.keys(oc.ARCHIVED))


def test_reusing_a_run_id_with_other_options_is_refused(spark, pulsar_client, pulsar_broker, tmp_path):
    from spark_apps.dlq_replay.errors import RunStateError

    mixed = build_mixed_dlq(pulsar_client, per_kind=1)
    out = tmp_path / "out"
    run_replay(spark, options(mixed, out, "r", oc.DRY_RUN, pulsar_broker))
    with pytest.raises(RunStateError, match="changed: max_replays"):
        run_replay(spark, options(mixed, out, "r", oc.DRY_RUN, pulsar_broker, max_replays=5))


def test_empty_dlq_reports_nothing_and_succeeds(spark, pulsar_client, pulsar_broker, topic_factory, tmp_path):
    topic = topic_factory("empty-DLQ")
    pulsar_client.create_producer(topic).close()  # the topic exists, with no message
    opts = ReplayOptions(
        run_id="empty-1",
        mode=oc.REPLAY,
        service_url=pulsar_broker.service_url,
        admin_url=pulsar_broker.admin_url,
        topics=(topic,),
        output_dir=str(tmp_path / "out"),
        origin_allowlist=("orders*",),
        idle_timeout_ms=1000,
    )
    report = run_replay(spark, opts)
    assert report["status"] == "succeeded"
    assert report["totals"]["snapshot"] == 0
    assert report["commit"]["read_mode"] == "reader"
    assert report["groups"] == []
    run_dir = tmp_path / "out" / "runs" / "empty-1"
    assert "No messages in this run" in (run_dir / "report.html").read_text()
    # The empty-window fast path: every step complete, no message step ran a Spark job or wrote data.
    state = json.loads((run_dir / "state.json").read_text())
    assert all(
        state["steps"][s]["status"] == "complete" for s in ("snapshot", "decide", "apply", "record", "commit")
    )
    assert state["steps"]["snapshot"]["empty_window"] is True
    assert not (run_dir / "snapshot").exists()
    assert not (run_dir / "decisions").exists()
    assert not (tmp_path / "out" / "ledger").exists()
    # A message arriving later is replayed by the next run as usual.
    producer = pulsar_client.create_producer(topic)
    producer.send(b"{}", properties=ours("persistent://public/default/orders", "ValueError", "bad"))
    producer.close()
    later = run_replay(spark, dataclasses.replace(opts, run_id="empty-2", mode=oc.DRY_RUN))
    assert later["totals"]["snapshot"] == 1


def test_a_small_run_after_an_earlier_one_waits_no_idle_timeout_and_counts_exactly(
    spark, pulsar_client, pulsar_service_url, tmp_path
):
    """8 messages left over by a run whose last message was republished: the next run must not wait for
    that acked message (twice the idle timeout); left_pending_seen counts the 8."""
    import json as _json
    import uuid

    from replay_e2e_support import order, ours

    idle_ms = 20_000
    u = uuid.uuid4().hex[:8]
    orders = f"persistent://public/default/orders-{u}"
    dlq = f"persistent://public/default/orders-{u}-sub-DLQ"
    fresh = f"persistent://public/default/orders-{u}-fresh-DLQ"
    producer = pulsar_client.create_producer(dlq, batching_enabled=False)
    for i in range(8):
        producer.send(order(i), properties=ours(orders, "RuntimeError", "unknown"), partition_key=f"s-{i}")
    for i in range(28):  # the partition's last messages: republished, hence acked, by the first run
        producer.send(order(i), properties=ours(orders, "TimeoutError", "slow"), partition_key=f"t-{i}")
    producer.close()
    producer = pulsar_client.create_producer(fresh, batching_enabled=False)
    for i in range(8):
        producer.send(order(i), properties=ours(orders, "RuntimeError", "unknown"), partition_key=f"f-{i}")
    producer.close()

    def run(run_id: str, topic: str, out) -> dict:
        opts = ReplayOptions(
            run_id=run_id, mode=oc.REPLAY, service_url=pulsar_service_url, topics=(topic,),
            output_dir=str(out), playbook=PLAYBOOK, origin_allowlist=("orders-*",), idle_timeout_ms=idle_ms,
        )  # fmt: skip
        return run_replay(spark, opts)

    out = tmp_path / "out"
    first = run("run-1", dlq, out)
    assert (first["totals"]["republished"], first["totals"]["skipped"]) == (28, 8)
    assert first["commit"]["left_pending_seen"] == 8
    baseline = run("fresh-1", fresh, tmp_path / "fresh-out")  # a first run of the same size
    second = run("run-2", dlq, out)
    assert second["totals"]["snapshot"] == 8
    assert second["totals"]["skipped"] == 8
    assert second["totals"]["acked"] == 0
    assert second["commit"]["left_pending_seen"] == 8  # was 0: the commit read nothing
    plan = _json.loads((out / "runs" / "run-2" / "plan.json").read_text())
    assert [s["settled_by"] for s in plan["settled"]] == [["run-1"]]
    assert plan["settled"][0]["end_message_id"].split(":")[1] == "7"  # the 8th (last pending) entry
    # Without the settled window the read waited for the acked last message: 2 x 20 s idle.
    assert second["timings"]["snapshot"] < idle_ms / 1000
    assert second["timings"]["snapshot"] < baseline["timings"]["snapshot"] + 10
    assert pending_keys_of(pulsar_client, dlq) == sorted(f"s-{i}" for i in range(8))


def pending_keys_of(client, topic: str) -> list[str]:
    return sorted(m.partition_key() for m in drain(client, topic, "dlq-replayer"))


def test_waves_follow_the_brokers_deduplication(spark, pulsar_client, pulsar_broker, tmp_path):
    """More sequence ids per producer than one small wave: with deduplication on every origin topic (the
    admin REST says so) the run sends in large waves, since a re-send is dropped by the broker; with it off
    it keeps the small waves that bound a re-send after a kill. Every message is republished once, every
    wave's tasks reading the decide tasks' files (nothing is copied)."""
    import uuid

    from replay_e2e_support import order, ours

    from pulsar_dlq_consumer.replay_options import DEFAULT_WAVE_SIZE
    from pulsar_standalone.admin import AdminClient

    n = DEFAULT_WAVE_SIZE + 100  # one producer (parallelism 1): two small waves, or one large one
    admin = AdminClient(pulsar_broker.admin_url)
    off = f"acme/nodedup-{uuid.uuid4().hex[:8]}"
    admin.create_namespace(off)
    admin.set_deduplication(off, False)
    for namespace, dedup in (("public/default", True), (off, False)):
        u = uuid.uuid4().hex[:8]
        origin = f"persistent://{namespace}/orders-{u}"
        dlq = f"persistent://{namespace}/orders-{u}-sub-DLQ"
        pulsar_client.subscribe(origin, "verify").close()  # keep what is republished
        # Blocking when the client's queue is full: without it send_async drops what does not fit.
        producer = pulsar_client.create_producer(dlq, batching_enabled=True, block_if_queue_full=True)
        results: list[object] = []
        sent = results.append
        for i in range(n):
            props = ours(origin, "TimeoutError", "slow")
            producer.send_async(
                order(i), lambda res, _id, sent=sent: sent(res), properties=props, partition_key=f"k{i}"
            )
        producer.flush()
        producer.close()
        assert len(results) == n
        assert {str(r) for r in results} == {"Result.Ok"}, set(map(str, results))
        out = tmp_path / u
        opts = ReplayOptions(
            run_id="waves", mode=oc.REPLAY, service_url=pulsar_broker.service_url,
            admin_url=pulsar_broker.admin_url, topics=(dlq,), output_dir=str(out), playbook=PLAYBOOK,
            origin_allowlist=(f"persistent://{namespace}/orders-*",), idle_timeout_ms=1500, parallelism=1,
        )  # fmt: skip
        report = run_replay(spark, opts)
        assert report["totals"]["republished"] == n
        apply = json.loads((out / "runs" / "waves" / "state.json").read_text())["steps"]["apply"]
        assert apply["wave_size"] == (DEDUP_WAVE_SIZE if dedup else DEFAULT_WAVE_SIZE), namespace
        assert apply["waves_done"] == (1 if dedup else 2)
        steps = json.loads((out / "runs" / "waves" / "state.json").read_text())["steps"]
        # The record tasks zip each bucket's decisions with its results of every wave, and keep the
        # report's groups.
        assert any((out / "runs" / "waves" / "report_parts").iterdir())
        group = report["groups"][0]
        assert (group["count"], group["outcomes"], len(group["sample_message_ids"])) == (
            n,
            {"republished": n},
            5,
        )
        assert group["explanation"]["matched_rule"] is not None
        ledger = spark.read.parquet(str(out / "ledger")).filter("run_id = 'waves'")
        assert ledger.filter("outcome = 'republished' AND published_message_id IS NOT NULL").count() == n
        # The read tasks wrote each row's replay id into the snapshot; decide's marks read them.
        snapshot_files = sorted((out / "runs" / "waves" / "snapshot").glob("part-*.parquet"))
        assert snapshot_files
        assert all("_rid" in pq.read_schema(f).names for f in snapshot_files)
        # The read and record tasks counted each entry: one commit task per partition acks from those
        # counts, every message acked and verified on the cursor.
        assert any((out / "runs" / "waves" / "commit_parts").glob("part-*.parquet"))
        commit = steps["commit"]
        assert (commit["acked"], commit["unacked_final"], commit["left_pending_seen"]) == (n, 0, 0)
        assert commit["entries_acked"] == steps["plan"]["pending_entries"]
        assert len(drain(pulsar_client, origin, "verify")) == n
