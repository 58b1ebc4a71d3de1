"""What a replay left on a topic, read without consuming it (the provider's integration tests)."""

from __future__ import annotations

from typing import Any


def keys_on(client: Any, topic: str) -> list[str]:
    """The keys of every message stored on ``topic``, sorted (a Reader from the earliest: acks nothing)."""
    import pulsar

    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    keys = []
    try:
        while reader.has_message_available():
            keys.append(reader.read_next(30_000).partition_key())
    finally:
        reader.close()
    return sorted(keys)
