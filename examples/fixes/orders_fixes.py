"""Fixes for the demo "orders" service, whose messages are JSON orders.

A fix receives one failed record (``record.payload``, ``record.key``, ``record.properties``,
``record.context`` with the error context) and returns the fixed payload, or a ``(payload, properties)``
tuple. Raising marks the record unfixable (``fix_failed``); a payload that is not JSON raises
``json.JSONDecodeError``, which the replay app reports as ``malformed``. Fixes are plain functions: this
module imports nothing from the project, so it can be tested on its own.
"""

from __future__ import annotations

import json
from typing import Any

DEFAULT_CURRENCY = "EUR"


def add_default_currency(record: Any) -> tuple[bytes, dict[str, str]]:
    """Orders published before the currency field existed: default it, and say so in a property."""
    order = json.loads(record.payload)
    if not isinstance(order, dict):
        raise ValueError("an order must be a JSON object")
    amount = order.get("amount")
    if not isinstance(amount, (int, float)) or amount < 0:
        raise ValueError(f"cannot fix an order with amount {amount!r}")
    order.setdefault("currency", DEFAULT_CURRENCY)
    properties = dict(record.properties)
    properties["orders.currency-defaulted"] = "true"
    return json.dumps(order, sort_keys=True).encode("utf-8"), properties
