"""Readable message ids, ``"<ledger>:<entry>:<partition>:<batch_index>"`` (-1: none), and their order."""

from __future__ import annotations

from typing import Any

MessageIdKey = tuple[int, int, int, int]


def message_id_str(msg_id: Any, partition: int) -> str:
    """The readable id of a ``pulsar.MessageId`` in ``partition`` (the id's own may be -1)."""
    return f"{msg_id.ledger_id()}:{msg_id.entry_id()}:{partition}:{msg_id.batch_index()}"


def message_id_key(text: str) -> MessageIdKey:
    """Parse a readable id into ``(ledger, entry, partition, batch_index)`` for ordering."""
    try:
        ledger, entry, partition, batch = (int(p) for p in text.split(":"))
    except (AttributeError, ValueError):
        raise ValueError(
            f"invalid message id {text!r}: expected '<ledger>:<entry>:<partition>:<batch_index>' (all four "
            "fields must be integers), e.g. '12:345:-1:-1' (use message_id_str() to produce it)"
        ) from None
    return ledger, entry, partition, batch


def in_window(ledger: int, entry: int, batch_index: int, end: MessageIdKey | None) -> bool:
    """True when a message is at or before ``end`` (``None``: empty; batch -1 names the whole entry)."""
    if end is None:
        return False
    end_ledger, end_entry, _, end_batch = end
    if (ledger, entry) != (end_ledger, end_entry):
        return (ledger, entry) < (end_ledger, end_entry)
    return end_batch < 0 or batch_index <= end_batch
