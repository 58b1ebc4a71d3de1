"""Error signatures: masking and stability."""

from __future__ import annotations

import pyarrow as pa
import pytest

from spark_apps.dlq_replay.signatures import error_signatures, message_template, replay_id


def error_signature(*row: str | None) -> str:
    """The signature of one row, by the batch function the decide step runs."""
    return error_signatures(*(pa.array([value], pa.string()) for value in row))[0].as_py()


@pytest.mark.parametrize(
    ("message", "template"),
    [
        ("Order 123 failed", "Order <num> failed"),
        ("price -12.50 out of range", "price <num> out of range"),
        ("no customer bob@example.com", "no customer <email>"),
        ("id 550e8400-e29b-41d4-a716-446655440000 unknown", "id <uuid> unknown"),
        ("hash deadbeef12 at 0x7fff1234", "hash <hex> at <hex>"),
        ("KeyError: 'customer_id'", "KeyError: <str>"),
        ('missing field "currency" in order', "missing field <str> in order"),
        ("order ORD-000123 not found", "order <id> not found"),
        ("timed out after 3.5s", "timed out after <num>s"),
        ("  many   spaces\n here ", "many spaces here"),
        ("", ""),
        (None, ""),
    ],
)
def test_template_masks_variable_parts(message, template):
    assert message_template(message) == template


def test_same_kind_of_failure_gets_the_same_signature():
    a = message_template("Order 123 for bob@x.com failed: 'EUR' unknown")
    b = message_template("Order 98765 for alice@y.org failed: 'USD' unknown")
    assert a == b
    assert error_signature("ValueError", a, "persistent://public/default/orders", "term") == error_signature(
        "ValueError", b, "persistent://public/default/orders", "term"
    )


def test_partitions_of_one_origin_share_a_signature_and_other_parts_differ():
    t = "bad <num>"
    base = error_signature("E", t, "persistent://p/d/orders", "term")
    assert error_signature("E", t, "persistent://p/d/orders-partition-3", "term") == base
    assert error_signature("F", t, "persistent://p/d/orders", "term") != base
    assert error_signature("E", "other", "persistent://p/d/orders", "term") != base
    assert error_signature("E", t, "persistent://p/d/payments", "term") != base
    # The failure reason separates failure paths: retry topic exhausted vs redelivery policy vs term.
    assert error_signature("E", t, "persistent://p/d/orders", "max-reconsumes") != base
    assert error_signature("E", t, "persistent://p/d/orders", "max-redeliveries") != base
    assert error_signature("E", t, "persistent://p/d/orders", None) == error_signature(
        "E", t, "persistent://p/d/orders", "unknown"
    )
    assert len(base) == 16
    assert int(base, 16) >= 0


def test_signature_is_stable_across_processes():
    # A hard-coded value guards against anyone making the hash depend on the process (e.g. hash()).
    import hashlib

    expected = hashlib.sha256(b"E\x1fbad <num>\x1fpersistent://p/d/orders\x1fterm").hexdigest()[:16]
    assert error_signature("E", "bad <num>", "persistent://p/d/orders", "term") == expected


def test_template_is_bounded():
    assert len(message_template("x" * 10_000)) == 512


def test_replay_id_depends_on_topic_and_id_without_an_origin():
    a = replay_id("persistent://p/d/dlq", "1:2:-1:-1")
    assert a == replay_id("persistent://p/d/dlq", "1:2:-1:-1")
    assert a != replay_id("persistent://p/d/dlq", "1:3:-1:-1")
    assert a != replay_id("persistent://p/d/dlq2", "1:2:-1:-1")
    assert len(a) == 32
    # The fallback is the 0.1.0 formula, so ledgers written before 0.2.0 keep matching.
    import hashlib

    assert a == hashlib.sha256(b"persistent://p/d/dlq\x1f1:2:-1:-1").hexdigest()[:32]


def test_replay_id_from_the_origin_is_the_same_for_every_dlq_copy():
    origin = "persistent://p/d/orders|7:8:-1:-1"
    a = replay_id("persistent://p/d/dlq", "1:2:-1:-1", origin)
    assert a == replay_id("persistent://p/d/other-DLQ", "9:9:-1:-1", origin)
    assert a != replay_id("persistent://p/d/dlq", "1:2:-1:-1")
    assert a != replay_id("persistent://p/d/dlq", "1:2:-1:-1", "persistent://p/d/orders|7:9:-1:-1")
