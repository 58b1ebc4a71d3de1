"""The benchmark's fix, as plain Python functions (standard library only).

The replay app ships this file to Spark through the playbook's ``fix_files`` and imports it as the
top-level module ``bench_fixes`` (fix reference ``bench_fixes:fix_order``); the hand-written
contenders import the same functions as ``bench.bench_fixes``. One source for both.
"""

from __future__ import annotations

import json
from typing import Any


def fix_document(doc: dict[str, Any]) -> dict[str, Any]:
    """Repair a failed order: decimal-comma strings become numbers, a missing currency becomes EUR,
    and the schema version is bumped. Raises ``ValueError`` when an amount is not a number."""
    fixed = dict(doc)
    fixed["amount"] = _number(doc["amount"])
    fixed["items"] = [{**item, "price": _number(item["price"])} for item in doc.get("items", [])]
    fixed.setdefault("currency", "EUR")
    fixed["schema_version"] = 2
    return fixed


def fix_payload(payload: bytes) -> bytes:
    """:func:`fix_document` on a JSON payload (bytes in, bytes out)."""
    return json.dumps(fix_document(json.loads(payload)), separators=(",", ":")).encode()


def fix_order(record: Any) -> bytes:
    """The replay app's fix (``bench_fixes:fix_order``): takes its ``FixRecord``, returns the payload;
    properties are kept as they are."""
    return fix_payload(record.payload)


def is_fixed(doc: dict[str, Any]) -> bool:
    """True when ``doc`` is what :func:`fix_document` produces."""
    return (
        doc.get("schema_version") == 2
        and isinstance(doc.get("amount"), float)
        and isinstance(doc.get("currency"), str)
        and all(isinstance(item.get("price"), float) for item in doc.get("items", []))
    )


def _number(value: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        return float(value.replace(",", "."))
    raise ValueError(f"amount must be a number or a decimal string; got {type(value).__name__}")
