"""Error signatures (one per kind of failure; with the failure reason, so a retry topic's exhausted
messages and a redelivery policy's never share a group) and replay ids (``REPLAY_ID``: the original's)."""

from __future__ import annotations

import hashlib
import re

import pyarrow as pa
import pyarrow.compute as pc

from pulsar_dlq_consumer.context import base_topic
from pulsar_dlq_consumer.conventions import REASON_UNKNOWN
from spark_apps.dlq_replay.arrow_util import per_distinct

MAX_TEMPLATE_CHARS = 512
_UUID = r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
#: Identifiers with a run of 2+ digits: ORD-000123, user_42, cust:17, A12345 (not utf-8).
_ID = r"\b[A-Za-z][A-Za-z0-9]*(?:[-_:#/.][A-Za-z0-9]+)*?[-_:#/.]?[0-9]{2,}[A-Za-z0-9]*\b"

# Order matters: earlier masks protect their matches from later ones.
_MASKS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"'[^'\n]*'|\"[^\"\n]*\"|`[^`\n]*`"), "<str>"),  # quoted, no newlines inside
    (re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"), "<email>"),
    (re.compile(_UUID), "<uuid>"),
    # 0x-prefixed hex, or 8+ hex characters with at least one digit and one letter a-f (hashes, ids).
    (re.compile(r"\b0[xX][0-9a-fA-F]+\b"), "<hex>"),
    (re.compile(r"\b(?=[0-9a-fA-F]*[0-9])(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b"), "<hex>"),
    (re.compile(_ID), "<id>"),
    (re.compile(r"(?<![A-Za-z0-9])[-+]?[0-9]+(?:[.,][0-9]+)*"), "<num>"),
)

#: :data:`_MASKS` as RE2 rewrites, exact for ASCII text (where ``\w`` and ``\b`` mean the same in both
#: engines) without the sentinels ``\x01``/``\x02``, each group skipped when no message of the batch passes
#: its cheap test. RE2 has no lookaround: the mixed-hex mask wraps long hex runs in sentinels, masks those
#: with a digit and a letter and unwraps the rest; the number mask keeps the character before as a group.
_RE2_MASKS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("['\"`]", ((r"'[^'\n]*'|\"[^\"\n]*\"|`[^`\n]*`", "<str>"),)),
    ("@", ((r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+", "<email>"),)),
    ("-", ((_UUID, "<uuid>"),)),
    ("0[xX]", ((r"\b0[xX][0-9a-fA-F]+\b", "<hex>"),)),
    (
        "[0-9a-fA-F]{8}",
        (
            (r"\b([0-9a-fA-F]{8,})\b", "\x01\\1\x02"),
            ("\x01(?:[0-9]+[a-fA-F]|[a-fA-F]+[0-9])[0-9a-fA-F]*\x02", "<hex>"),
            ("\x01([0-9a-fA-F]*)\x02", r"\1"),
        ),
    ),
    ("[A-Za-z_:#/.-][0-9]{2}", ((_ID, "<id>"),)),
    ("[0-9]", ((r"(^|[^A-Za-z0-9])[-+]?[0-9]+(?:[.,][0-9]+)*", r"\1<num>"),)),
    ("[\t\n\x0b\x0c\r\x1c-\x1f]| {2}", (("[\t\n\x0b\x0c\r\x1c-\x1f ]+", " "),)),  # str.split()'s
)


def message_template(message: str | None) -> str:
    """``message`` with its variable parts masked, at most 512 characters (``""`` for none)."""
    if not message:
        return ""
    text = message[: MAX_TEMPLATE_CHARS * 4]
    for pattern, mask in _MASKS:
        text = pattern.sub(mask, text)
    # Runs of whitespace become one space, none at the ends (str.split's whitespace is re's \s).
    return " ".join(text.split())[:MAX_TEMPLATE_CHARS]


def message_templates(messages: pa.Array) -> pa.Array:
    """:func:`message_template` of every value (null gives ``""``), by RE2 kernels for ASCII messages."""
    text = pc.utf8_slice_codeunits(pc.fill_null(messages, ""), 0, MAX_TEMPLATE_CHARS * 4)
    for needs, rewrites in _RE2_MASKS:
        if pc.any(pc.match_substring_regex(text, needs)).as_py():
            for pattern, mask in rewrites:
                text = pc.replace_substring_regex(text, pattern, mask)
    text = pc.utf8_slice_codeunits(pc.utf8_trim(text, " "), 0, MAX_TEMPLATE_CHARS)
    sentinel = pc.fill_null(pc.match_substring_regex(messages, "[\x01\x02]"), False)
    other = pc.or_(pc.invert(pc.string_is_ascii(pc.fill_null(messages, ""))), sentinel)
    if not other.true_count:
        return text
    done = per_distinct(messages.filter(other), message_template, pa.string())  # once per distinct message
    return pc.replace_with_mask(text, other, done)


def error_signatures(
    error_classes: pa.Array, templates: pa.Array, origin_topics: pa.Array, reasons: pa.Array
) -> pa.Array:
    """Stable 16-hex-digit id of each row's error class, template, origin topic (no partition) and reason."""
    reasons = pc.fill_null(reasons, REASON_UNKNOWN)
    material = pc.binary_join_element_wise(
        pc.fill_null(error_classes, ""),
        pc.fill_null(templates, ""),
        per_distinct(origin_topics, lambda topic: base_topic(topic) if topic else "", pa.string()),
        pc.if_else(pc.equal(reasons, ""), pa.scalar(REASON_UNKNOWN), reasons),
        "\x1f",
    )
    return per_distinct(material, lambda m: _digest(m, 16), pa.string())


def replay_id(dlq_topic: str, dlq_message_id: str, origin: str | None = None) -> str:
    """Stable id (32 hex digits) of the original message behind a DLQ message: from the ``origin`` identity
    (the same for every DLQ copy), else from the DLQ topic and message id (stable for that copy only)."""
    return _digest(f"origin\x1f{origin}" if origin else f"{dlq_topic}\x1f{dlq_message_id}", 32)


def _digest(material: str, digits: int) -> str:
    """The first ``digits`` hex digits of the SHA-256 of ``material`` (unencodable characters replaced)."""
    return hashlib.sha256(material.encode("utf-8", "replace")).hexdigest()[:digits]
