"""The real parts of the foundation: broker round trip, Spark job, provider registration."""

from __future__ import annotations

import glob
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def test_broker_round_trip_keeps_properties_and_key(pulsar_client, topic_factory):
    import pulsar

    topic = topic_factory("roundtrip")
    consumer = pulsar_client.subscribe(
        topic,
        "rt",
        consumer_type=pulsar.ConsumerType.Shared,
        initial_position=pulsar.InitialPosition.Earliest,
    )
    producer = pulsar_client.create_producer(topic)
    sent = {f"k{i}": f"v{i}".encode() for i in range(20)}
    for key, value in sent.items():
        producer.send(value, partition_key=key, properties={"n": key})
    got = {}
    for _ in sent:
        msg = consumer.receive(timeout_millis=5000)
        got[msg.partition_key()] = msg.data()
        assert msg.properties() == {"n": msg.partition_key()}
        consumer.acknowledge(msg)
    assert got == sent
    producer.close()
    consumer.close()


def test_broker_metrics_endpoint_is_private_and_live(pulsar_broker):
    import urllib.request

    assert pulsar_broker.metrics_url.startswith("http://127.0.0.1:")
    assert not pulsar_broker.metrics_url.startswith("http://127.0.0.1:8080/")
    body = urllib.request.urlopen(pulsar_broker.metrics_url, timeout=5).read().decode()
    assert "# TYPE" in body


def _listening_ports(pid: int) -> list[tuple[str, int]]:
    """(address, port) of the TCP sockets ``pid`` listens on, from /proc (IPv4 and IPv6)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A = LISTEN
                addr, port = cols[1].split(":")
                found.append((addr, int(port, 16)))
    return found


def test_apache_pulsar_listens_on_loopback_only(pulsar_broker):
    ports = _listening_ports(pulsar_broker.pid)
    assert len(ports) >= 3  # binary protocol, admin REST, bookie
    loopback = {"0100007F", "00000000000000000000000001000000"}
    assert all(addr in loopback for addr, _ in ports), ports
    assert int(pulsar_broker.service_url.rsplit(":", 1)[1]) in {p for _, p in ports}


def test_apache_pulsar_kill_restart_then_stop_leaves_nothing(tmp_path):
    """A private broker: killed and restarted on the same ports keeps acked data; stop removes it all."""
    import pulsar

    from pulsar_standalone import start_standalone

    broker = start_standalone()
    data_dir = broker.data_dir
    try:
        client = pulsar.Client(broker.service_url, logger=logging.getLogger("pulsar.test"))
        producer = client.create_producer("persistent://public/default/survives-restart")
        producer.send(b"kept")
        client.close()
        broker.kill()
        assert not broker.alive()
        broker.restart()
        client = pulsar.Client(broker.service_url, logger=logging.getLogger("pulsar.test"))
        reader = client.create_reader(
            "persistent://public/default/survives-restart", pulsar.MessageId.earliest
        )
        assert reader.read_next(10_000).data() == b"kept"
        client.close()
    finally:
        pid = broker.pid
        broker.stop()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not data_dir.exists()


def test_spark_job_runs_on_local2(spark):
    df = spark.range(0, 10_000, numPartitions=4).selectExpr("id % 7 AS k", "id")
    rows = {r["k"]: r["n"] for r in df.groupBy("k").count().withColumnRenamed("count", "n").collect()}
    assert sum(rows.values()) == 10_000
    assert rows[0] == len([i for i in range(10_000) if i % 7 == 0])
    assert spark.sparkContext.master == "local[2]"


def test_pyspark_python_files_match_the_jars():
    """Guards against pyspark-client overwriting pyspark's Python files (see pyproject [tool.uv])."""
    import pyspark

    jars = glob.glob(os.path.join(os.path.dirname(pyspark.__file__), "jars", "spark-core_*.jar"))
    assert jars, "pyspark jars not found"
    jar_version = Path(jars[0]).stem.rsplit("-", 1)[1]
    assert pyspark.__version__ == jar_version


def test_airflow_providers_list_shows_the_provider(airflow_db):
    out = subprocess.run(
        [str(Path(sys.executable).parent / "airflow"), "providers", "list", "--output", "json"],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    providers = {p["package_name"]: p for p in json.loads(out.stdout)}
    assert "airflow-provider-dlq" in providers
    from airflow_provider_dlq import __version__

    assert providers["airflow-provider-dlq"]["version"] == __version__


@pytest.mark.embedded
def test_embedded_broker_stops_by_pid(tmp_path):
    from airflow_provider_dlq.embedded_broker import start_embedded_broker

    broker = start_embedded_broker(tmp_path / "b")
    os.kill(broker.pid, 0)  # alive
    broker.stop()
    with pytest.raises(ProcessLookupError):
        os.kill(broker.pid, 0)
    logging.getLogger(__name__).info("stopped broker pid %s", broker.pid)
