"""Error signatures and replay ids.

A signature is a stable id per kind of failure, from error class + message template + origin topic +
failure reason (``term``, ``max-redeliveries``, ``max-reconsumes`` or ``unknown``): messages that
exhausted a retry topic and messages dead-lettered by a redelivery policy never share a group. The
template masks what varies between two failures of the same kind: quoted values, e-mails, UUIDs, hex
strings, identifiers containing digits and numbers. Masking is deterministic, so the same failure always
gets the same signature, run after run and machine after machine.

A replay id (``REPLAY_ID``) names the *original* message: every DLQ copy of one original gets the same
one, so a run republishes each original once (see :func:`replay_id`).
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING

from pulsar_dlq_consumer.context import REASON_UNKNOWN, base_topic

if TYPE_CHECKING:
    from collections.abc import Callable

MAX_TEMPLATE_CHARS = 512

# Order matters: earlier masks protect their matches from later ones. The first element is a cheap
# test for what every match of the mask contains (a quote, "@", "0x", ASCII digits...): where it fails,
# the mask would change nothing, so it is skipped. Most messages skip most masks.
_MASKS: tuple[tuple[Callable[[str], object], re.Pattern[str], str], ...] = (
    # Quoted values: '...', "...", `...` (no newlines inside).
    (re.compile(r"['\"`]").search, re.compile(r"'[^'\n]*'|\"[^\"\n]*\"|`[^`\n]*`"), "<str>"),
    (re.compile("@").search, re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"), "<email>"),
    (
        re.compile("-").search,
        re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"),
        "<uuid>",
    ),
    # 0x-prefixed hex, or 8+ hex characters with at least one digit and one letter a-f (hashes, ids).
    (re.compile(r"0[xX]").search, re.compile(r"\b0[xX][0-9a-fA-F]+\b"), "<hex>"),
    (
        re.compile(r"[0-9a-fA-F]{8}").search,
        re.compile(r"\b(?=[0-9a-fA-F]*[0-9])(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b"),
        "<hex>",
    ),
    # Identifiers with a run of 2+ digits: ORD-000123, user_42, cust:17, A12345 (not utf-8).
    (
        # In a match, the run of digits that holds the 2+ digits follows a letter or a separator.
        re.compile(r"[A-Za-z_:#/.-][0-9]{2}").search,
        re.compile(r"\b[A-Za-z][A-Za-z0-9]*(?:[-_:#/.][A-Za-z0-9]+)*?[-_:#/.]?[0-9]{2,}[A-Za-z0-9]*\b"),
        "<id>",
    ),
    (re.compile(r"[0-9]").search, re.compile(r"(?<![A-Za-z0-9])[-+]?[0-9]+(?:[.,][0-9]+)*"), "<num>"),
)


def message_template(message: str | None) -> str:
    """Return ``message`` with its variable parts masked (bounded to 512 characters).

    ``None`` or an empty message gives ``""``.
    """
    if not message:
        return ""
    text = message[: MAX_TEMPLATE_CHARS * 4]
    for needs, pattern, mask in _MASKS:
        if needs(text):
            text = pattern.sub(mask, text)
    # Runs of whitespace become one space, none at the ends (str.split's whitespace is re's \s).
    return " ".join(text.split())[:MAX_TEMPLATE_CHARS]


def signature_topic(origin_topic: str | None) -> str:
    """The origin topic as used in signatures: partitions of one topic share a signature."""
    return base_topic(origin_topic) if origin_topic else ""


def error_signature(
    error_class: str | None, template: str, origin_topic: str | None, reason: str | None
) -> str:
    """Stable 16-hex-digit id of (error class, template, origin topic without partition suffix, failure
    reason). ``None`` reason counts as ``unknown``."""
    material = "\x1f".join(
        (error_class or "", template, signature_topic(origin_topic), reason or REASON_UNKNOWN)
    )
    return hashlib.sha256(material.encode("utf-8", "replace")).hexdigest()[:16]


def replay_id(dlq_topic: str, dlq_message_id: str, origin: str | None = None) -> str:
    """Stable id of the original message behind a DLQ message (``REPLAY_ID``), 32 hex digits.

    ``origin`` is the origin identity from the error context
    (:func:`~pulsar_dlq_consumer.context.origin_identity`): every DLQ copy of one original,
    in any DLQ topic and any convention, gets the same id. Without it the id is derived from the DLQ
    topic and message id (as before 0.2.0), so it is stable for that DLQ message only.
    """
    material = f"origin\x1f{origin}" if origin else f"{dlq_topic}\x1f{dlq_message_id}"
    return hashlib.sha256(material.encode("utf-8", "replace")).hexdigest()[:32]


class TemplateCache:
    """Memoise :func:`message_template` within one Arrow batch (failures repeat a lot)."""

    def __init__(self, max_entries: int = 10_000) -> None:
        self._cache: dict[str, str] = {}
        self._max = max_entries

    def template(self, message: str | None) -> str:
        if not message:
            return ""
        found = self._cache.get(message)
        if found is None:
            found = message_template(message)
            if len(self._cache) < self._max:
                self._cache[message] = found
        return found
