"""The replay on a broker with production settings, as a least-privilege role.

One broker per version (module scope) runs with token authentication and authorization on, topic
auto-creation off and batch-index acknowledgement on (``PRODUCTION_SETTINGS``). Every topic is created
by the superuser up front, as an operator would. The replayer role gets exactly the permissions the docs
list (docs/apache-pulsar.md, "Least privilege"):

* ``consume`` on each DLQ topic (the snapshot's Readers, the replayer subscription, the commit's acks
  and the admin REST stats the reader mode reads);
* ``consume`` on each DLQ topic's lease topic ``dlq-replay-lease-<hash>``;
* ``produce`` on each origin topic.

The replay never uses the superuser token. Each missing permission is a case of its own: the run is
either refused up front (exit 2, naming the permission, nothing written to the broker) or the messages
it cannot place are parked (``publish_failed``, still pending, nothing lost, status ``partial``).
"""

from __future__ import annotations

import contextlib
import http.server
import threading
import urllib.error
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulsar
import pytest
from matrix_support import (
    EXIT_USAGE,
    PRODUCTION_LABEL,
    PRODUCTION_SETTINGS,
    REPLAYER,
    SUPERUSER,
    MatrixRow,
    SecuredBroker,
    exit_code_of,
    production_versions,
    summary,
)

from pulsar_dlq_consumer.replay_lock import lease_topic
from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay.broker_checks import check_broker
from spark_apps.dlq_replay.options import ReplayOptions
from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf
from spark_apps.dlq_replay.runner import run_replay

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
PLAYBOOK = str(REPO / "examples" / "playbooks" / "orders.yaml")
DLQ_NS, ORIGIN_NS = "acme/dlq", "acme/orders"
PARTITIONS = 2
#: Messages per origin: republished (TimeoutError), archived (JSONDecodeError), skipped (no rule).
REPLAY, ARCHIVE, SKIP = 12, 4, 4
BATCH = 5  # messages per batched DLQ entry: entries mix republished, archived and skipped messages


@pytest.fixture(scope="module", params=production_versions())
def prod(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBroker]:
    """Apache Pulsar with the production settings, its superuser token and the tenant acme."""
    import secrets

    from pulsar_standalone import start_standalone

    folder = tmp_path_factory.mktemp("pulsar-production")
    secret = secrets.token_bytes(32)
    (folder / "secret.key").write_bytes(secret)
    secured = SecuredBroker(broker=None, secret=secret, folder=folder)
    overrides = {
        **PRODUCTION_SETTINGS,
        "superUserRoles": SUPERUSER,
        "tokenSecretKey": f"file://{folder / 'secret.key'}",
        "brokerClientAuthenticationParameters": f"token:{secured.token(SUPERUSER)}",
    }
    secured.broker = start_standalone(
        conf_overrides=overrides, admin_token=secured.token(SUPERUSER), version=request.param
    )
    try:
        admin = secured.admin()
        admin.create_tenant("acme")
        for namespace in (DLQ_NS, ORIGIN_NS):
            admin.create_namespace(namespace)
        yield secured
    finally:
        secured.broker.stop()


@dataclass
class Dlq:
    """A partitioned DLQ whose messages go back to two origins (one partitioned, one not)."""

    dlq: str
    origins: dict[str, str]  # "a" (partitioned) and "b" (non-partitioned) -> topic
    expected: dict[str, str] = field(default_factory=dict)  # key -> outcome

    def keys(self, outcome: str, origin: str | None = None) -> set[str]:
        return {
            k for k, v in self.expected.items() if v == outcome and (origin is None or k.startswith(origin))
        }


def make_dlq(prod: SecuredBroker, *, create: tuple[str, ...] = ("dlq", "lease", "a", "b")) -> Dlq:
    """Create (as the superuser) the topics named in ``create`` and fill the DLQ in batched entries."""
    u = uuid.uuid4().hex[:8]
    dlq = Dlq(
        dlq=f"persistent://{DLQ_NS}/orders-{u}-sub-DLQ",
        origins={
            "a": f"persistent://{ORIGIN_NS}/orders-{u}-a",
            "b": f"persistent://{ORIGIN_NS}/orders-{u}-b",
        },
    )
    prod.create_topic(dlq.dlq, PARTITIONS)
    if "lease" in create:
        prod.create_topic(lease_topic(dlq.dlq))
    for name in ("a", "b"):
        if name in create:
            prod.create_topic(dlq.origins[name], PARTITIONS if name == "a" else 0)
    client = prod.client(SUPERUSER)
    try:
        producer = client.create_producer(
            dlq.dlq, batching_enabled=True, batching_max_messages=BATCH, batching_max_publish_delay_ms=60_000,
            message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution,
            batching_type=pulsar.BatchingType.Default,
        )  # fmt: skip
        n = 0
        for name, origin in dlq.origins.items():
            for kind, count, cls, outcome in (
                ("t", REPLAY, "TimeoutError", oc.REPUBLISHED),
                ("j", ARCHIVE, "json.decoder.JSONDecodeError", oc.ARCHIVED),
                ("s", SKIP, "RuntimeError", oc.SKIPPED),
            ):
                for i in range(count):
                    key = f"{name}-{kind}-{i}"
                    props = {
                        "REAL_TOPIC": origin,
                        "ORIGIN_MESSAGE_ID": f"7:{n}:-1:-1",
                        "__dlq.errors.topic": origin,
                        "__dlq.errors.reason": "term",
                        "__dlq.errors.exception.class": cls,
                        "__dlq.errors.exception.message": "inventory timed out after 30s",
                    }
                    producer.send_async(b'{"order_id": "ORD-1"}', None, properties=props, partition_key=key)
                    dlq.expected[key] = outcome
                    n += 1
        producer.flush()
        producer.close()
    finally:
        client.close()
    return dlq


def grant_all(prod: SecuredBroker, dlq: Dlq, *, skip: tuple[str, ...] = ()) -> None:
    """The replayer's permissions (the docs' table), less those named in ``skip``."""
    if "dlq" not in skip:
        prod.grant(dlq.dlq, REPLAYER, "consume")
    if "lease" not in skip:  # Apache Pulsar 4.2 refuses a grant on a topic that does not exist (404)
        prod.grant(lease_topic(dlq.dlq), REPLAYER, "consume")
    for name, origin in dlq.origins.items():
        if name not in skip:
            prod.grant(origin, REPLAYER, "produce")


def options(prod: SecuredBroker, dlq: Dlq, out: Path, run_id: str, **kw: Any) -> ReplayOptions:
    """A replay run as the replayer (its token file; never the superuser's)."""
    given: dict[str, Any] = {"admin_url": prod.broker.admin_url, **kw}
    return ReplayOptions(
        run_id=run_id,
        mode=oc.REPLAY,
        service_url=prod.broker.service_url,
        auth_token_file=prod.token_file(REPLAYER),
        topics=(dlq.dlq,),
        output_dir=str(out),
        playbook=PLAYBOOK,
        origin_allowlist=(f"persistent://{ORIGIN_NS}/orders-*",),
        idle_timeout_ms=1500,
        **given,
    )


def on_origin(prod: SecuredBroker, topic: str) -> Counter[str]:
    """Keys of every message on ``topic`` (each partition read with a Reader, as the superuser)."""
    client = prod.client(SUPERUSER)
    keys: Counter[str] = Counter()
    try:
        for partition in client.get_topic_partitions(topic):
            reader = client.create_reader(partition, pulsar.MessageId.earliest)
            try:
                while reader.has_message_available():
                    keys[reader.read_next(10_000).partition_key()] += 1
            finally:
                reader.close()
    finally:
        client.close()
    return keys


def entries(prod: SecuredBroker, dlq: Dlq) -> dict[str, tuple[str, int, int]]:
    """The DLQ entry (partition, ledger, entry) of each message key (Readers, as the superuser)."""
    client = prod.client(SUPERUSER)
    out: dict[str, tuple[str, int, int]] = {}
    try:
        for partition in client.get_topic_partitions(dlq.dlq):
            reader = client.create_reader(partition, pulsar.MessageId.earliest)
            try:
                while reader.has_message_available():
                    msg = reader.read_next(10_000)
                    out[msg.partition_key()] = (
                        partition,
                        msg.message_id().ledger_id(),
                        msg.message_id().entry_id(),
                    )
            finally:
                reader.close()
    finally:
        client.close()
    return out


def whole_entries(prod: SecuredBroker, dlq: Dlq, keys: set[str]) -> set[str]:
    """Every message that shares a batched entry with one of ``keys``: the replay acks whole entries, so
    an entry holding a message left pending stays pending as a whole (its final messages are recorded
    in the ledger and not republished again)."""
    where = entries(prod, dlq)
    held = {where[k] for k in keys}
    return {k for k, e in where.items() if e in held}


def pending(prod: SecuredBroker, dlq: Dlq) -> set[str]:
    """Keys the replayer subscription still delivers (batch-index ack on: acked indexes of a batch are
    not delivered again)."""
    client = prod.client(SUPERUSER)
    got: set[str] = set()
    try:
        consumer = client.subscribe(
            dlq.dlq, "dlq-replayer", consumer_type=pulsar.ConsumerType.Shared,
            initial_position=pulsar.InitialPosition.Earliest, consumer_name=f"verify-{uuid.uuid4().hex[:6]}",
            batch_index_ack_enabled=True,  # a batch index acked on the broker is not delivered again
        )  # fmt: skip
        try:
            while True:
                try:
                    got.add(consumer.receive(timeout_millis=1500).partition_key())
                except pulsar.Timeout:
                    break
        finally:
            consumer.close()
    finally:
        client.close()
    return got


@dataclass(frozen=True)
class End:
    lost: int
    doubled: int
    pending: int
    republished: dict[str, Counter[str]]


def end_state(prod: SecuredBroker, dlq: Dlq, out: Path) -> End:
    """Lost (neither placed nor pending), doubled (extra copies on an origin) and pending counts."""
    copies = {name: on_origin(prod, topic) for name, topic in dlq.origins.items() if exists(prod, topic)}
    left = pending(prod, dlq)
    archived = set(archived_keys(out))
    lost = 0
    for key in dlq.expected:
        placed = any(key in c for c in copies.values()) or key in archived
        lost += not placed and key not in left
    doubled = sum(n - 1 for c in copies.values() for n in c.values() if n > 1)
    return End(lost, doubled, len(left), copies)


def exists(prod: SecuredBroker, topic: str) -> bool:
    path = "/admin/v2/" + topic.replace("persistent://", "persistent/", 1)
    try:
        prod.admin().get(f"{path}/partitions")
    except Exception:
        return False
    return True


def archived_keys(out: Path) -> list[str]:
    import pyarrow.dataset as ds

    if not (out / "archive").exists():
        return []
    table = ds.dataset(str(out / "archive"), format="parquet").to_table(columns=["key"])
    return [str(k) for k in table.column("key").to_pylist()]


def record(table: Any, prod: SecuredBroker, case: str, result: str, end: End | None = None) -> None:
    table.record(
        MatrixRow(
            prod.version,
            PRODUCTION_LABEL,
            case,
            result,
            *((end.lost, end.doubled, end.pending) if end else ("-", "-", "-")),
        )
    )


def refused(run: Any) -> BaseException:
    """The error a run raised (it must raise)."""
    with pytest.raises(Exception) as caught:
        run()
    return caught.value


# --------------------------------------------------------------------------- cases


def test_least_privilege_replay_of_a_partitioned_batched_dlq(prod, spark, tmp_path, matrix_table):
    dlq = make_dlq(prod)
    grant_all(prod, dlq)
    out = tmp_path / "out"
    report = run_replay(spark, options(prod, dlq, out, "least-privilege"))
    assert report["status"] == "succeeded", report.get("status")
    totals = report["totals"]
    assert (totals["republished"], totals["archived"], totals["skipped"]) == (
        2 * REPLAY,
        2 * ARCHIVE,
        2 * SKIP,
    )
    end = end_state(prod, dlq, out)
    assert end.lost == 0
    assert end.doubled == 0
    assert {k for c in end.republished.values() for k in c} == dlq.keys(oc.REPUBLISHED)
    assert set(end.republished["a"]) == dlq.keys(oc.REPUBLISHED, "a")
    # Whole entries are acked: the entries holding a skipped message stay pending, nothing else.
    held = whole_entries(prod, dlq, dlq.keys(oc.SKIPPED))
    assert pending(prod, dlq) == held
    assert totals["left_pending"] == 2 * SKIP  # the report counts messages decided pending
    assert sorted(archived_keys(out)) == sorted(dlq.keys(oc.ARCHIVED))
    # A second run meets the held entries' final messages again: recorded in the ledger, not resent.
    again = run_replay(spark, options(prod, dlq, out, "least-privilege-2"))
    assert again["status"] == "succeeded", again.get("status")
    assert again["totals"]["republished"] == 0
    end = end_state(prod, dlq, out)
    assert (end.lost, end.doubled) == (0, 0)
    assert pending(prod, dlq) == held
    result = (
        f"status succeeded as the replayer role: {summary(report, 'republished', 'archived', 'skipped')}, "
        f"acked {totals['acked']}, {len(held)} pending in the entries holding the skipped ones; a second "
        f"run republished {again['totals']['republished']}"
    )
    record(matrix_table, prod, "least-privilege replay", result, end)
    record(
        matrix_table,
        prod,
        "partitioned DLQ and origin",
        f"{PARTITIONS}-partition DLQ in batched entries of {BATCH} mixing outcomes, a {PARTITIONS}-partition "
        "and a non-partitioned origin: each republished message once; pending: the entries holding a skipped "
        "message, whole",
        end,
    )


def test_lease_topic_not_created_is_refused_up_front(prod, spark, tmp_path, matrix_table):
    dlq = make_dlq(prod, create=("dlq", "a", "b"))
    grant_all(prod, dlq, skip=("lease",))
    out = tmp_path / "out"
    error = refused(lambda: run_replay(spark, options(prod, dlq, out, "no-lease-topic")))
    assert exit_code_of(error) == 2, repr(error)
    lease = lease_topic(dlq.dlq)
    assert f"pulsar-admin topics create {lease}" in str(error)  # names what to create
    end = end_state(prod, dlq, out)
    assert (end.lost, sum(map(len, end.republished.values())), end.pending) == (0, 0, len(dlq.expected))
    record(matrix_table, prod, "lease topic not created", f"exit 2: {str(error)[:220]}", end)


def test_origin_topic_not_created_parks_its_messages(prod, spark, tmp_path, matrix_table):
    dlq = make_dlq(prod, create=("dlq", "lease", "a"))
    grant_all(prod, dlq, skip=("b",))
    with contextlib.suppress(urllib.error.HTTPError):  # a grant on a topic not created may be refused
        prod.grant(dlq.origins["b"], REPLAYER, "produce")
    out = tmp_path / "out"
    report = run_replay(spark, options(prod, dlq, out, "no-origin-topic"))
    parked_case(report, prod, dlq, out, matrix_table, "origin topic not created")


def test_no_produce_on_one_origin_parks_its_messages(prod, spark, tmp_path, matrix_table):
    dlq = make_dlq(prod)
    grant_all(prod, dlq, skip=("b",))
    out = tmp_path / "out"
    report = run_replay(spark, options(prod, dlq, out, "no-produce"))
    parked_case(report, prod, dlq, out, matrix_table, "no produce on one origin")


def parked_case(
    report: dict[str, Any], prod: SecuredBroker, dlq: Dlq, out: Path, table: Any, case: str
) -> None:
    """Origin b's messages to republish are parked: ``publish_failed``, pending; the rest is exact."""
    totals = report["totals"]
    assert report["status"] != "succeeded", totals
    assert totals[oc.PUBLISH_FAILED] == REPLAY
    assert totals["republished"] == REPLAY
    end = end_state(prod, dlq, out)
    assert end.lost == 0
    assert end.doubled == 0
    assert set(end.republished["a"]) == dlq.keys(oc.REPUBLISHED, "a")
    assert sum(map(len, (c for n, c in end.republished.items() if n != "a"))) == 0
    assert pending(prod, dlq) == whole_entries(
        prod, dlq, dlq.keys(oc.SKIPPED) | dlq.keys(oc.REPUBLISHED, "b")
    )
    counts = summary(report, "republished", "publish_failed", "archived", "skipped")
    result = f"status {report['status']}: {counts}"
    record(table, prod, case, result, end)


def test_no_consume_on_the_dlq_is_refused_before_anything_is_written(prod, spark, tmp_path, matrix_table):
    """The command line's broker check (before Spark starts) is refused the DLQ's lookup: exit 2, naming
    the permission; nothing is written to the broker or the output directory."""
    dlq = make_dlq(prod)
    grant_all(prod, dlq, skip=("dlq",))
    out = tmp_path / "out"
    checked = options(prod, dlq, out, "no-consume")
    error = refused(lambda: check_broker(PulsarConf.from_app_options(checked), checked.topics))
    code = exit_code_of(error)
    assert code == EXIT_USAGE, repr(error)
    assert "AuthorizationError" in str(error)
    assert "--actions consume" in str(error)
    assert not out.exists()
    end = end_state(prod, dlq, out)
    assert (end.lost, sum(map(len, end.republished.values())), end.pending) == (0, 0, len(dlq.expected))
    result = f"exit {code}, nothing written: {type(error).__name__}: {str(error)[:200]}"
    record(matrix_table, prod, "no consume on the DLQ", result, end)


def test_no_admin_rest_runs_in_consumer_mode(prod, spark, tmp_path, matrix_table):
    dlq = make_dlq(prod)
    grant_all(prod, dlq)
    out = tmp_path / "out"
    report = run_replay(spark, options(prod, dlq, out, "no-admin", admin_url=None))
    assert report["status"] == "succeeded"
    assert report["commit"]["read_mode"] != "reader"
    end = end_state(prod, dlq, out)
    assert (end.lost, end.doubled) == (0, 0)
    assert pending(prod, dlq) == whole_entries(prod, dlq, dlq.keys(oc.SKIPPED))
    result = (
        f"status succeeded without an admin URL ({report['commit']['read_mode']} mode): "
        f"{summary(report, 'republished', 'archived', 'skipped')}"
    )
    record(matrix_table, prod, "no admin REST", result, end)


class _Refusing(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(403)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_admin_rest_refused_is_refused_up_front(prod, spark, tmp_path, matrix_table):
    """An admin URL that answers 403 to the replayer (e.g. an ingress that lets only operators in)."""
    dlq = make_dlq(prod)
    grant_all(prod, dlq)
    out = tmp_path / "out"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        admin_url = f"http://127.0.0.1:{server.server_address[1]}"
        error = refused(lambda: run_replay(spark, options(prod, dlq, out, "admin-403", admin_url=admin_url)))
    finally:
        server.shutdown()
        server.server_close()
    assert exit_code_of(error) == 2, repr(error)
    assert "HTTP 403" in str(error)
    end = end_state(prod, dlq, out)
    assert (end.lost, sum(map(len, end.republished.values())), end.pending) == (0, 0, len(dlq.expected))
    record(matrix_table, prod, "admin REST refused", f"exit 2: {str(error)[:220]}", end)
