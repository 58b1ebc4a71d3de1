"""The apply step's wave size follows the broker: deduplication read from Apache Pulsar's admin REST."""

from __future__ import annotations

import uuid

import pytest

from pulsar_standalone.admin import AdminClient
from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf
from spark_apps.dlq_replay.pulsar_io.dedup import deduplication

pytestmark = pytest.mark.integration


def test_deduplication_as_the_broker_applies_it(pulsar_broker, pulsar_client, topic_factory):
    conf = PulsarConf(pulsar_broker.service_url, admin_url=pulsar_broker.admin_url)
    on = topic_factory("dedup-on")
    pulsar_client.create_producer(on).close()  # the topic exists
    # The session broker deduplicates by default (brokerDeduplicationEnabled=true in its standalone.conf).
    found = deduplication(conf, [on])
    assert found.on, found.reason

    admin = AdminClient(pulsar_broker.admin_url)
    namespace = f"acme/nodedup-{uuid.uuid4().hex[:8]}"
    admin.create_namespace(namespace)
    admin.set_deduplication(namespace, False)  # a namespace policy overrides the broker's default
    off = topic_factory("dedup-off", namespace=namespace)
    pulsar_client.create_producer(off).close()
    found = deduplication(conf, [on, off])
    assert not found.on
    assert off in found.reason


def test_without_an_admin_url_or_an_answer_the_answer_is_no(pulsar_broker):
    topic = "persistent://public/default/anything"
    no_admin = deduplication(PulsarConf(pulsar_broker.service_url), [topic])
    assert not no_admin.on
    assert "no admin URL" in no_admin.reason
    # Not Apache Pulsar's admin REST (the binary port answers no HTTP): doubt means no.
    wrong = PulsarConf(pulsar_broker.service_url, admin_url="http://127.0.0.1:9")
    assert not deduplication(wrong, [topic]).on
    assert not deduplication(PulsarConf(pulsar_broker.service_url, admin_url=pulsar_broker.admin_url), []).on
