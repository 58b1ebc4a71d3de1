"""The benchmark harness: its workload is exact, its checks catch wrong answers, and a small run of every
contender (including spark-submit of the replay app) verifies. No timing assertions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import workload
from bench.bench_fixes import fix_payload, is_fixed

REPO_ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- workload (pure)


def test_workload_has_20_signatures_split_80_20_over_4_origins():
    assert workload.SIGNATURE_COUNT == 20
    assert len({(s.error_class, s.template) for s in workload.SIGNATURES}) == 20
    assert sum(s.action == workload.ARCHIVE for s in workload.SIGNATURES) == 4
    assert {s.origin for s in workload.SIGNATURES} == set(workload.ORIGIN_TOPICS)
    expected = workload.expected_counts(1_000_000)
    assert (expected.republish, expected.archive) == (800_000, 200_000)
    assert sum(workload.backlog_per_dlq(1_000_000).values()) == 1_000_000


@pytest.mark.parametrize("n", [0, 1, 19, 21, 399, 1000])
def test_expected_counts_match_the_generated_messages_exactly(n):
    messages = list(workload.generate(n))
    decided = [workload.decide(m.properties) for m in messages]
    expected = workload.expected_counts(n)
    assert decided.count(workload.REPUBLISH) == expected.republish
    assert decided.count(workload.ARCHIVE) == expected.archive
    per_dlq: dict[str, int] = {}
    for m in messages:
        per_dlq[m.dlq_topic] = per_dlq.get(m.dlq_topic, 0) + 1
    assert {t: c for t, c in workload.backlog_per_dlq(n).items() if c} == per_dlq


def test_payloads_are_1_kib_json_and_the_fix_repairs_them():
    for i in (0, 7, 99_999, 999_999):
        payload = workload.make_payload(i)
        assert len(payload) == workload.PAYLOAD_BYTES
        doc = json.loads(payload)
        assert doc["event_id"] == i
        assert not is_fixed(doc)
        fixed = json.loads(fix_payload(payload))
        assert is_fixed(fixed)
        assert fixed["event_id"] == i
        assert fixed["amount"] == float(doc["amount"].replace(",", "."))


def test_properties_are_written_by_the_consumer_library_and_parse_back():
    from pulsar_dlq_consumer.context import parse_error_context

    for i in (0, 16, 39):
        sig = workload.signature_of(i)
        ctx = parse_error_context(workload.make_properties(i), dlq_topic=sig.dlq)
        assert ctx.context_format == "ours"
        assert ctx.origin_topic == sig.origin
        assert ctx.error_class == sig.error_class
        assert ctx.error_message == sig.template.format(**workload._fields(i))


def test_playbook_is_valid_for_the_replay_app(tmp_path):
    from bench.playbook import write_playbook
    from spark_apps.dlq_replay.playbook import MatchInput, load_playbook

    playbook = load_playbook(str(write_playbook(tmp_path / "playbook.yaml")))
    for sig in workload.SIGNATURES:
        record = MatchInput("sig", sig.error_class, sig.template, sig.origin, "ours", {})
        rule = playbook.first_match(record)
        assert rule is not None
        assert rule.action == sig.action


class _FakeId:
    def __init__(self, entry: int, batch_index: int = -1) -> None:
        self._entry, self._batch = entry, batch_index

    def ledger_id(self) -> int:
        return 7

    def entry_id(self) -> int:
        return self._entry

    def batch_index(self) -> int:
        return self._batch

    def partition(self) -> int:
        return -1


class _FakeMessage:
    def __init__(self, entry: int, batch_index: int = -1) -> None:
        self._id = _FakeId(entry, batch_index)

    def message_id(self) -> _FakeId:
        return self._id


class _RedeliveringReader:
    """Delivers entries 0-2, then 1 and 2 again (pulsar-lite's Reader), then entry 3, then times out."""

    def __init__(self) -> None:
        self._queue = [_FakeMessage(e) for e in (0, 1, 2, 1, 2)] + [_FakeMessage(3, 0), _FakeMessage(3, 1)]

    def read_next(self, timeout_millis: int) -> _FakeMessage:
        import pulsar

        if not self._queue:
            raise pulsar.Timeout()
        return self._queue.pop(0)


def test_reader_batches_drop_a_message_id_delivered_again():
    """The verification's Reader counts a message once however often the broker delivers its id; two
    messages of one batched entry are two messages."""
    from bench.pulsar_io import ReaderBatches

    class _Client:
        def create_reader(self, topic, start, receiver_queue_size):
            return _RedeliveringReader()

    batches = ReaderBatches(_Client(), "persistent://t/n/orders-0")
    got = batches.batch_receive()

    assert [(m.message_id().entry_id(), m.message_id().batch_index()) for m in got] == [
        (0, -1),
        (1, -1),
        (2, -1),
        (3, 0),
        (3, 1),
    ]
    assert batches.redelivered == 2


# --------------------------------------------------------------------------- checks catch wrong answers


@pytest.mark.integration
def test_verification_rejects_a_duplicate_and_a_missing_message(tmp_path):
    """A contender that republishes one message twice and drops another must not pass."""
    from airflow_provider_dlq.embedded_broker import start_embedded_broker
    from bench import verify
    from bench.contenders import ContenderSpec
    from bench.contenders.tuned import run
    from bench.produce import prepare_and_produce
    from bench.pulsar_io import ConfirmedProducers, make_client

    n = 60
    with start_embedded_broker(tmp_path / "broker") as broker:
        prepare_and_produce(broker.service_url, n)
        backlog = workload.backlog_per_dlq(n)
        spec = ContenderSpec(
            service_url=broker.service_url,
            dlq_topics=workload.DLQ_TOPICS,
            backlog=tuple(backlog[t] for t in workload.DLQ_TOPICS),
            subscription=workload.DLQ_SUBSCRIPTION,
            archive_path=str(tmp_path / "archive.jsonl"),
            idle_timeout_s=30,
        )
        result = run(spec)
        assert result["republished"] == workload.expected_counts(n).republish

        good = verify.Verification()
        verify.verify_origins(broker.service_url, n, mode="replay", lineage=False, result=good)
        verify.verify_jsonl_archive(tmp_path / "archive.jsonl", n, good)
        verify.verify_pending(broker.service_url, good)
        assert good.ok, good.errors

        # Now spoil it: a second copy of message 0 on its origin.
        client = make_client(broker.service_url)
        try:
            producers = ConfirmedProducers(client)
            duplicate = fix_payload(workload.make_payload(0))
            producers.send(workload.signature_of(0).origin, duplicate, {"tenant": "acme"})
            producers.close()
        finally:
            client.close()
        bad = verify.Verification()
        verify.verify_origins(broker.service_url, n, mode="replay", lineage=False, result=bad)
        assert not bad.ok
        assert bad.checks["origin.duplicates"] == 1
        with pytest.raises(verify.BenchError, match=r"origin\.duplicates"):
            bad.raise_if_failed("spoilt")

    lines = (tmp_path / "archive.jsonl").read_text().splitlines()
    (tmp_path / "archive.jsonl").write_text("\n".join(lines[1:]) + "\n")
    short = verify.Verification()
    verify.verify_jsonl_archive(tmp_path / "archive.jsonl", n, short)
    assert short.errors
    assert "archive.rows" in short.errors[0]


@pytest.mark.integration
def test_app_outputs_are_verified_from_the_s3_server(tmp_path):
    """The verifier reads the report's archive and ledger from the S3 server with the server's own
    settings (none in this process's environment), and a missing ledger row fails it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bench import verify
    from bench.output_root import output_root

    n = 40
    expected = workload.expected_counts(n)
    with output_root("s3", tmp_path, "verify-test") as root:
        assert root.uri == "s3://dlq-bench/verify-test"
        assert "AWS_ENDPOINT_URL_S3" not in os.environ
        fs, base = root.filesystem(root.uri)
        for name, rows in (("archive", expected.archive), ("ledger", n - 1)):
            table = pa.table({"message_id": [str(i) for i in range(rows)]})
            pq.write_table(table, f"{base}/{name}/run_id=r1/part-0.parquet", filesystem=fs)
        report = {
            "status": "succeeded",
            "run_id": "r1",
            "totals": {"snapshot": n, "republished": expected.republish, "archived": expected.archive,
                       "acked": n, "left_pending": 0},
            "paths": {"archive": f"{root.uri}/archive", "ledger": "s3a://dlq-bench/verify-test/ledger"},
        }  # fmt: skip
        check = verify.Verification()
        verify.verify_app_outputs(report, n, check, root)
    assert check.checks["archive.rows"] == expected.archive
    assert check.errors == [f"ledger.rows: got {n - 1}, expected {n}"]


# --------------------------------------------------------------------------- the smoke run

OURS_NAMES = ("ours", "ours_local1", "ours_cluster", "ours_connect")


def _run_bench(tmp_path: Path, *extra: str) -> tuple[dict, Path]:
    cmd = [
        sys.executable,
        "-m",
        "bench",
        "--results-dir",
        str(tmp_path / "results"),
        "--scratch-dir",
        str(tmp_path / "scratch"),
        "--idle-timeout",
        "60",
        "--timeout",
        "900",
        *extra,
    ]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=1800, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    (out_dir,) = (tmp_path / "results").iterdir()
    assert not list((tmp_path / "scratch").iterdir()), "the harness left run data behind"
    return json.loads((out_dir / "results.json").read_text()), out_dir


@pytest.mark.integration
@pytest.mark.slow
def test_smoke_run_of_every_contender_verifies_on_apache_pulsar(tmp_path):
    """`python -m bench` at a small N on Apache Pulsar, output root on the S3 server: every contender (the
    replay on local[2], local[1], a Spark standalone cluster of two workers and a Spark Connect server on
    local[2]) runs, writes its run directory, archive and ledger to S3, is verified from there; JSON is
    written. (The embedded-broker smoke run below covers the local output root.)"""
    n = 400
    data, out_dir = _run_bench(
        tmp_path, "--sizes", str(n), "--handwritten-max", "200", "--brokers", "apache", "--output-root", "s3"
    )
    by_name = {r["contender"]: r for r in data["results"]}
    assert set(by_name) == {"ceiling", "handwritten", "tuned", *OURS_NAMES}
    assert {r["broker"] for r in data["results"]} == {"apache"}
    assert data["output_root"] == "s3"
    expected = workload.expected_counts(n)
    for name, r in by_name.items():
        assert r["ok"], (name, r["errors"])
        assert r["wall_s"] > 0
        assert r["msgs_per_s"] > 0
        assert r["checks"]["dlq.left_pending"] == 0
        assert r["checks"]["origin.duplicates"] == 0
        assert r["checks"]["origin.missing"] == 0
    assert by_name["ceiling"]["checks"]["origin.messages"] == n
    assert by_name["ceiling"]["details"]["reported"]["settings"]["workers"] >= 1
    assert by_name["tuned"]["checks"]["origin.messages"] == expected.republish
    assert by_name["tuned"]["checks"]["archive.rows"] == expected.archive
    # the hand-written baseline ran on 200 messages and was extrapolated, and says so
    hand = by_name["handwritten"]
    assert (hand["extrapolated"], hand["measured_n"], hand["n"]) == (True, 200, n)
    assert hand["checks"]["origin.messages"] == workload.expected_counts(200).republish
    for name in OURS_NAMES:
        ours = by_name[name]
        assert ours["checks"]["report.in_output_root"] is True
        assert ours["checks"]["report.republished"] == expected.republish
        assert ours["checks"]["archive.rows"] == expected.archive
        assert ours["checks"]["ledger.rows"] == n
        assert ours["checks"]["report.groups"] == 20
        assert ours["details"]["timings"]
        assert 0 < ours["work_s"] < ours["wall_s"]
        assert ours["details"]["output_root"] == "s3"
        assert ours["details"]["output_dir"] == f"s3://dlq-bench/apache-{n}-{name}"
        assert ours["memory_mib"]["py_driver_mib"] > 0
    # the driver JVM starts from the managed class-data archive (written by a warm-up when missing)
    assert data["class_data_archive"]["used"]
    assert Path(data["class_data_archive"]["path"]).is_file()
    assert {by_name[name]["details"]["class_data_archive"] for name in OURS_NAMES} == {"used"}
    assert by_name["ours_local1"]["details"]["master"] == "local[1]"
    assert by_name["ours_cluster"]["details"]["master"].startswith("spark://127.0.0.1:")
    assert by_name["ours_connect"]["details"]["master"].startswith("sc://127.0.0.1:")
    assert by_name["ours_connect"]["details"]["connect_server_master"] == "local[2]"
    # the cluster's executors and the Connect server (its JVM and Python workers) are sampled too
    for name in ("ours_cluster", "ours_connect"):
        assert by_name[name]["memory_mib"]["py_workers_mib"] > 0, name
        assert by_name[name]["memory_mib"]["remote_jvm_mib"] > 0, name
    assert by_name["ours"]["memory_mib"]["jvm_mib"] > 0
    assert by_name["ours"]["memory_mib"]["remote_jvm_mib"] == 0
    ratios = data["comparisons"]["ratios"][f"apache/{n}"]
    assert set(ratios) >= {"ours/ceiling", "ours/handwritten", "ours/tuned", "ours/ours_local1"}
    assert ratios["ours_connect/ours"] > 0
    assert data["comparisons"]["scaling"][0]["steps"]
    # the targets are set at 100k, 1M and 3M: listed, none judged at 400
    targets = data["comparisons"]["targets"]
    assert {t["broker"] for t in targets} == {"apache"}
    assert {t["met"] for t in targets} == {None}
    text = (out_dir / "results.md").read_text()
    assert "Class-data archive: used" in text
    assert "Output root (S3 (moto on loopback))" in text
    assert "Targets (Apache Pulsar only):" in text
    assert "| Spark Connect / local[2], end to end | 1M | n/a | >= 0.8 | n/a (not run) |" in text
    assert "extrapolated from 200" in text
    assert "local[1] time / local[2] time" in text


@pytest.mark.integration
@pytest.mark.slow
def test_smoke_run_on_the_embedded_broker_and_an_empty_dlq(tmp_path):
    """The same harness on pulsar-lite, with an empty DLQ beside a small one, output root on a local
    disk; pulsar-lite is not a performance target, so no target is printed for it."""
    data, out_dir = _run_bench(
        tmp_path, "--sizes", "0,200", "--brokers", "lite", "--contenders", "ceiling,ours"
    )
    runs = {(r["contender"], r["n"]): r for r in data["results"]}
    assert set(runs) == {("ceiling", 0), ("ours", 0), ("ceiling", 200), ("ours", 200)}
    for key, r in runs.items():
        assert r["ok"], (key, r["errors"])
        assert r["broker"] == "lite"
    assert runs[("ours", 0)]["checks"]["report.snapshot"] == 0
    assert runs[("ours", 0)]["checks"]["report.groups"] == 0
    assert runs[("ours", 200)]["checks"]["ledger.rows"] == 200
    assert runs[("ours", 200)]["checks"]["report.in_output_root"] is True
    assert runs[("ours", 200)]["details"]["output_root"] == "local"
    assert data["comparisons"]["targets"] == []
    assert "Targets" not in (out_dir / "results.md").read_text()


def test_decide_profile_times_every_phase(capsys):
    """`python -m bench.profile_decide` times each phase of a decide task on a real batch of the workload."""
    from bench import profile_decide

    batch = profile_decide.snapshot_batch(40)
    assert batch.num_rows == 40
    figures = profile_decide.measure(batch, repeat=1)
    assert set(figures) == {"identities", "normalise", "decide", "of which the fix", "normalise + decide"}
    assert all(value > 0 for value in figures.values()), figures
    assert profile_decide.main(["--n", "40", "--repeat", "1"]) == 0
    assert "of which the fix" in capsys.readouterr().out


def test_broker_floors_move_every_message_on_both_brokers(tmp_path):
    """`python -m bench.floors` times the read, read+ack and send phases on a fresh broker filled with
    the workload; every phase moves exactly the messages it must (400 read, 320 republished)."""
    from bench import floors

    apache = floors.measure("apache", 400, 2, tmp_path)
    assert [(f.phase, f.processes, f.messages) for f in apache] == [
        ("read", 2, 400),
        ("read+ack", 2, 400),
        ("send", 2, 320),
    ]
    assert all(f.seconds > 0 for f in apache)
    out = tmp_path / "results"
    cmd = [sys.executable, "-m", "bench.floors", "--sizes", "400", "--brokers", "lite"]
    cmd += ["--processes", "1,2", "--results-dir", str(out), "--scratch-dir", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = out.iterdir()
    lite = json.loads((run_dir / "floors.json").read_text())
    assert sorted((f["phase"], f["processes"], f["messages"]) for f in lite) == [
        ("read", 1, 400),
        ("read", 2, 400),
        ("read+ack", 1, 400),
        ("read+ack", 2, 400),
        ("send", 1, 320),
        ("send", 2, 320),
    ]
    assert "| pulsar-lite | 400 | send |" in proc.stdout
    assert "2 over 1" in (run_dir / "floors.md").read_text()
    assert list(tmp_path.glob("dlq-bench-floors-*")) == []  # the scratch data is deleted


def test_floors_table_gives_the_speed_up_of_more_processes():
    from bench.floors import Floor, floors_table

    table = floors_table(
        [Floor("apache", 1000, "read", 1, 1000, 2.0), Floor("apache", 1000, "read", 2, 1000, 1.6)]
    )
    assert "| Apache Pulsar | 1,000 | read | 2.00 (500) | 1.60 (625) | 1.25 |" in table
    failed = floors_table(
        [Floor("lite", 1000, "read+ack", 1, 1000, 2.0), Floor("lite", 1000, "read+ack", 2, 0, 0.0, "stalled")]
    )
    assert "| pulsar-lite | 1,000 | read+ack | 2.00 (500) | FAILED | |" in failed
