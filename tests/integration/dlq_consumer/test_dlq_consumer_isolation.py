"""Process-level guarantees: runs without Airflow; a crash between produce and ack duplicates, never loses."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

import pulsar
import pytest
from dlq_consumer_helpers import drain, read_all

from pulsar_dlq_consumer import parse_error_context

pytestmark = pytest.mark.integration

NO_AIRFLOW_SCRIPT = textwrap.dedent(
    """
    import importlib.abc, json, logging, sys

    class BlockAirflow(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "airflow" or name.startswith("airflow."):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
            return None

    sys.meta_path.insert(0, BlockAirflow())
    try:
        import airflow  # noqa: F401
    except ModuleNotFoundError:
        pass
    else:
        raise SystemExit("the import blocker does not work")

    import pulsar
    from pulsar_dlq_consumer import DeadLetterPolicy, DlqConsumer, parse_error_context
    from pulsar_dlq_consumer.context import KEY_REASON

    url, topic = sys.argv[1], sys.argv[2]
    client = pulsar.Client(url, logger=logging.getLogger("pulsar"))
    producer = client.create_producer(topic)
    producer.send(b"no-airflow", properties={"x": "1"})
    with DlqConsumer(client, topic, "s", dead_letter_policy=DeadLetterPolicy(),
                     initial_position=pulsar.InitialPosition.Earliest) as consumer:
        dlq = client.subscribe(consumer.dead_letter_topic, "check", consumer_type=pulsar.ConsumerType.Shared,
                               initial_position=pulsar.InitialPosition.Earliest)
        consumer.term(consumer.receive(timeout_millis=5000), ValueError("boom"))
        dead = dlq.receive(timeout_millis=5000)
        dlq.acknowledge(dead)
    ctx = parse_error_context(dead.properties())
    print(json.dumps({"airflow_loaded": any(m == "airflow" or m.startswith("airflow.") for m in sys.modules),
                      "reason": ctx.reason, "payload": dead.data().decode(), "key": KEY_REASON}))
    client.close()
    sys.stdout.flush()
    # pulsar-client may abort during interpreter shutdown (apache/pulsar-client-python#256): exit now.
    import os
    os._exit(0)
    """
)


def test_library_imports_and_works_without_airflow(pulsar_broker, topic_factory):
    topic = topic_factory("noairflow")
    proc = subprocess.run(
        [sys.executable, "-c", NO_AIRFLOW_SCRIPT, pulsar_broker.service_url, topic],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {
        "airflow_loaded": False,
        "reason": "term",
        "payload": "no-airflow",
        "key": "__dlq.errors.reason",
    }


CRASH_SCRIPT = textwrap.dedent(
    """
    import logging, os, signal, sys
    import pulsar
    from pulsar_dlq_consumer import DeadLetterPolicy, DlqConsumer, RetryPolicy

    url, topic, action = sys.argv[1], sys.argv[2], sys.argv[3]
    client = pulsar.Client(url, logger=logging.getLogger("pulsar"))
    consumer = DlqConsumer(client, topic, "s", dead_letter_policy=DeadLetterPolicy(),
                           retry_policy=RetryPolicy(), initial_position=pulsar.InitialPosition.Earliest)
    msg = consumer.receive(timeout_millis=5000)

    def die(*args, **kwargs):  # the copy is confirmed by the broker; crash before the ack leaves
        sys.stdout.write("produced\\n"); sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    consumer.consumer.acknowledge = die
    if action == "term":
        consumer.term(msg, ValueError("crash test"))
    else:
        consumer.reconsume_later(msg, 30)
    sys.stdout.write("survived\\n")
    """
)


@pytest.mark.parametrize("action", ["term", "reconsume_later"])
def test_crash_between_produce_and_ack_duplicates_never_loses(
    pulsar_client, pulsar_broker, topic_factory, action
):
    topic = topic_factory(f"crash-{action.replace('_', '-')}")
    producer = pulsar_client.create_producer(topic)
    sent_id = producer.send(b"order-42", properties={"k": "v"})
    proc = subprocess.run(
        [sys.executable, "-c", CRASH_SCRIPT, pulsar_broker.service_url, topic, action],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr[-3000:])
    assert proc.stdout.split() == ["produced"]
    copy_topic = f"{topic}-s-DLQ" if action == "term" else f"{topic}-s-RETRY"
    # A Reader sees the retry copy now; the broker holds it 30 s from Shared subscriptions.
    copies = read_all(pulsar_client, copy_topic, expected=1)
    assert [m.data() for m in copies] == [b"order-42"]
    ctx = parse_error_context(copies[0].properties())
    assert ctx.origin_message_id == str(sent_id)
    if action == "term":
        assert ctx.reason == "term"
    else:
        assert copies[0].properties()["RECONSUMETIMES"] == "1"
        assert copies[0].properties()["DELAY_TIME"] == "30000"
    # The original was never acked, so the subscription redelivers it: a duplicate, not a loss.
    origin = pulsar_client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    (again,) = drain(origin, expected=1)
    assert str(again.message_id()) == str(sent_id)
    assert again.data() == b"order-42"
    origin.close()
    producer.close()


LEAK_SCRIPT = textwrap.dedent(
    """
    import logging, os, sys
    import pulsar
    from pulsar_dlq_consumer import DeadLetterPolicy, DlqConsumer, RetryPolicy

    logging.basicConfig(level=logging.DEBUG)  # even with DEBUG on, payloads must not be logged
    url, topic = sys.argv[1], sys.argv[2]
    client = pulsar.Client(url, logger=logging.getLogger("pulsar"))
    producer = client.create_producer(topic)
    with DlqConsumer(client, topic, "s", dead_letter_policy=DeadLetterPolicy(), retry_policy=RetryPolicy(),
                     initial_position=pulsar.InitialPosition.Earliest) as consumer:
        producer.send(b"\\xff\\x00SECRET-PAYLOAD-1")
        msg = consumer.receive(timeout_millis=5000)
        consumer.reconsume_later(msg, 1)
        msg = consumer.receive(timeout_millis=5000)
        consumer.term(msg, "done")
    client.close()
    print("finished")
    # pulsar-client with a Python logger can abort at interpreter exit (apache/pulsar-client-python#256).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
    """
)


def test_payloads_are_never_logged_even_non_utf8_with_retry(pulsar_broker, topic_factory):
    """pulsar-client's multi-topic consumer would print this payload to stdout; ours must not."""
    proc = subprocess.run(
        [sys.executable, "-c", LEAK_SCRIPT, pulsar_broker.service_url, topic_factory("leak")],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert b"finished" in proc.stdout
    assert b"SECRET-PAYLOAD" not in proc.stdout + proc.stderr
