"""The demo: fill real DLQs with the example orders service, replay them with Airflow + Spark, show it.

Run by ``scripts/demo.sh`` (which sets up the environment). Everything it starts, it stops. It exits
non-zero, without claiming success, as soon as a step does not do what it should.

The broker is the embedded ``pulsar-lite`` by default (zero setup); ``--broker apache-pulsar`` (or
``DLQ_DEMO_BROKER=apache-pulsar``) runs the same demo on Apache Pulsar standalone (``pulsar_standalone``),
where retry delays are real and the backlog comes from admin REST.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEMO_DIR = ROOT / ".demo"
sys.path.insert(0, str(ROOT / "examples"))

import orders_service  # noqa: E402  (the example service next to this file)

from airflow_provider_dlq.embedded_broker import start_embedded_broker  # noqa: E402

BROKERS = ("embedded", "apache-pulsar")

RUN_ID = "demo-nightly"


class DemoFailed(RuntimeError):
    """A demo step did not do what it should."""


def step(title: str) -> None:
    print(f"\n=== {title}", flush=True)


def run(cmd: list[str], *, env: dict[str, str], log: Path | None = None, timeout: float = 900) -> str:
    """Run ``cmd``; stream nothing, keep the output in ``log``; raise with the log's tail on failure."""
    started = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if log is not None:
        log.write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
        raise DemoFailed(f"`{' '.join(cmd[:4])} ...` exited {proc.returncode}:\n{tail}")
    print(f"    ({time.monotonic() - started:.1f} s)", flush=True)
    return proc.stdout


def count_replayed_on_origin(service_url: str) -> tuple[int, int, dict[str, str]]:
    """Read the origin topic from the start with a fresh subscription: (all, replayed, a lineage sample)."""
    import pulsar

    client = pulsar.Client(service_url, logger=logging.getLogger("pulsar.demo"))
    try:
        consumer = client.subscribe(
            orders_service.ORDERS_TOPIC,
            f"demo-audit-{int(time.time())}",
            consumer_type=pulsar.ConsumerType.Shared,
            initial_position=pulsar.InitialPosition.Earliest,
        )
        total, replayed, sample = 0, 0, {}
        while True:
            try:
                msg = consumer.receive(timeout_millis=3000)
            except pulsar.Timeout:
                break
            total += 1
            props = msg.properties()
            if "REPLAY_ID" in props:
                replayed += 1
                sample = {k: v for k, v in props.items() if k.startswith("REPLAY")}
            consumer.acknowledge(msg)
        consumer.close()
        return total, replayed, sample
    finally:
        client.close()


def print_groups(report: dict[str, Any]) -> None:
    header = f"    {'group (error class: message template)':<66} {'count':>5}  {'action':<9} outcomes"
    print(header)
    print("    " + "-" * (len(header) - 4))
    for group in report.get("groups", []):
        label = f"{group.get('error_class') or '-'}: {group.get('template') or '-'}"
        if len(label) > 66:
            label = label[:63] + "..."
        outcomes = ", ".join(f"{k}={v}" for k, v in sorted((group.get("outcomes") or {}).items()) if v)
        print(f"    {label:<66} {group.get('count', 0):>5}  {group.get('action') or '-':<9} {outcomes}")


def start_broker(kind: str) -> Any:
    """Start the chosen broker; the returned object has service_url, metrics_url and stop()."""
    if kind == "apache-pulsar":
        from pulsar_standalone import start_standalone

        step("1/6 Start Apache Pulsar standalone (pulsar_standalone: Maven Central jars, Java 21)")
        broker = start_standalone(DEMO_DIR / "broker")
        print(f"    {broker.describe()}")
        return broker
    step("1/6 Start the embedded Pulsar broker (pulsar-lite)")
    broker = start_embedded_broker(DEMO_DIR / "broker")
    print(f"    service URL {broker.service_url}, metrics {broker.metrics_url}, pid {broker.pid}")
    return broker


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument(
        "--broker",
        choices=BROKERS,
        default=os.environ.get("DLQ_DEMO_BROKER", "embedded"),
        help="embedded (pulsar-lite, default) or apache-pulsar (Apache Pulsar standalone)",
    )
    args = parser.parse_args(argv)
    if DEMO_DIR.exists():
        shutil.rmtree(DEMO_DIR)
    DEMO_DIR.mkdir(parents=True)
    output_dir = DEMO_DIR / "dlq-data"
    airflow_home = DEMO_DIR / "airflow"

    broker = start_broker(args.broker)
    extra = {"metrics_url": broker.metrics_url}
    if args.broker == "apache-pulsar":
        extra["admin_url"] = broker.admin_url
    # Real retry delays (1 s, 5 s, 10 s) on Apache Pulsar: the service waits longer before it calls it a day.
    idle = ["--idle-timeout", "15" if args.broker == "apache-pulsar" else "3"]
    try:
        env = {
            **os.environ,
            "AIRFLOW_HOME": str(airflow_home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
            "AIRFLOW_CONN_PULSAR_DEFAULT": json.dumps(
                {
                    "conn_type": "pulsar",
                    "host": broker.service_url,
                    "extra": extra,
                }
            ),
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
            "AIRFLOW_VAR_DLQ_TOPICS": orders_service.DLQ_TOPIC,
            "AIRFLOW_VAR_DLQ_SUBSCRIPTION": orders_service.REPLAY_SUBSCRIPTION,
            "AIRFLOW_VAR_DLQ_PLAYBOOK": str(ROOT / "examples" / "playbooks" / "orders.yaml"),
            "AIRFLOW_VAR_DLQ_OUTPUT_DIR": str(output_dir),
            "AIRFLOW_VAR_DLQ_ORIGIN_ALLOWLIST": orders_service.ORDERS_TOPIC,
            "AIRFLOW_VAR_DLQ_NIGHTLY_MODE": "replay",
            "DLQ_SENSOR_POLL_SECONDS": "2",
            "DLQ_SENSOR_TIMEOUT_SECONDS": "120",
            "DLQ_REPLAY_RETRIES": "1",
            "DLQ_REPLAY_RETRY_DELAY_SECONDS": "1",
        }
        service = [sys.executable, str(ROOT / "examples" / "orders_service.py")]
        url = ["--service-url", broker.service_url]

        step("2/6 The orders service fails on some orders (inventory service down)")
        produced = json.loads(run([*service, "produce", *url], env=env))
        print(f"    published {produced['produced']} orders to {produced['topic']}")
        counts = json.loads(run([*service, "consume", *url, *idle, "--inventory", "down"], env=env))
        print(
            f"    deliveries {counts['received']}: processed {counts['processed']}, termed to the DLQ "
            f"{counts['termed']} (rule violations, bad JSON), retried {counts['retried']} via the retry "
            f"topic (inventory timeouts, until the 3 retries ran out), nacked {counts['nacked']} with backoff"
        )
        print(f"    failed orders now wait in {orders_service.DLQ_TOPIC}")

        step("3/6 Prepare Airflow (SQLite metadata DB in .demo/airflow)")
        run(["airflow", "db", "migrate"], env=env, log=DEMO_DIR / "airflow-db-migrate.log")

        step("4/6 airflow dags test dlq_nightly_replay: backlog sensor -> Spark replay -> report")
        print("    (spark-submit on local[2]; this takes about a minute; full log: .demo/dags-test.log)")
        run(["airflow", "dags", "test", "dlq_nightly_replay"], env=env, log=DEMO_DIR / "dags-test.log")
        reports = sorted(output_dir.glob("runs/*/report.json"))
        if not reports:
            raise DemoFailed(f"the DAG run finished but wrote no report under {output_dir}/runs")
        report = json.loads(reports[-1].read_text())
        if report.get("status") != "succeeded":
            raise DemoFailed(f"the replay run ended with status {report.get('status')!r}")
        totals = report["totals"]
        print(f"    run id {report['run_id']} ({report['mode']}), status {report['status']}")
        print("    totals: " + ", ".join(f"{k}={v}" for k, v in totals.items()))
        print("\n    Per error group (signature), what the playbook decided and what happened:")
        print_groups(report)
        paths = report.get("paths", {})
        print("\n    Where things are:")
        for name in ("report_html", "report_json", "archive", "ledger", "snapshot"):
            if name in paths:
                print(f"      {name:<12} {paths[name]}")

        step("5/6 The orders service runs again (inventory back up) and receives the replayed orders")
        counts = json.loads(run([*service, "consume", *url, *idle, "--inventory", "up"], env=env))
        print(f"    processed {counts['processed_replayed']} replayed orders (carrying REPLAY_ID lineage)")

        step("6/6 Proof on the origin topic")
        total, replayed, sample = count_replayed_on_origin(broker.service_url)
        print(f"    {orders_service.ORDERS_TOPIC}: {total} messages, {replayed} of them replays")
        print(f"    lineage of one replayed message: {json.dumps(sample, sort_keys=True)}")
        expected = int(totals.get("republished", 0))
        if replayed != expected or counts["processed_replayed"] != expected or expected == 0:
            raise DemoFailed(
                f"expected {expected} republished orders on the origin topic and in the service; "
                f"found {replayed} on the topic and {counts['processed_replayed']} processed"
            )
        archived, dropped = totals.get("archived", 0), totals.get("dropped", 0)
        print(
            f"\nDemo complete: {expected} fixed orders replayed exactly once, {archived} archived, "
            f"{dropped} dropped (audited), {totals.get('left_pending', 0)} left pending in the DLQ "
            "for a human (see the report)."
        )
        return 0
    except DemoFailed as exc:
        print(f"\nDEMO FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.broker == "apache-pulsar":
            broker.stop(remove_data=True)
        else:
            broker.stop()
        print(f"\n({args.broker} broker stopped)")


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # see examples/orders_service.py: pulsar-client may abort during interpreter shutdown
