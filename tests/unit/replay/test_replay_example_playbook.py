"""The example playbook and fix of the demo "orders" service (examples/)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from spark_apps.dlq_replay.fixes import FixRecord, run_fix
from spark_apps.dlq_replay.playbook import MatchInput, load_playbook

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
ORDERS = "persistent://public/default/orders"


@pytest.fixture(scope="module")
def fixes():
    spec = importlib.util.spec_from_file_location(
        "orders_fixes_example", EXAMPLES / "fixes" / "orders_fixes.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record(payload: bytes) -> FixRecord:
    return FixRecord(payload, "k", None, {"source": "web"}, None, {}, "sig", "dlq", "1:1:-1:-1")


def test_add_default_currency(fixes):
    out = run_fix(fixes.add_default_currency, [record(b'{"id": "o-1", "amount": 12.5}')])[0]
    assert out.ok
    assert json.loads(out.payload) == {"id": "o-1", "amount": 12.5, "currency": "EUR"}
    assert out.properties == {"source": "web", "orders.currency-defaulted": "true"}
    kept = run_fix(fixes.add_default_currency, [record(b'{"amount": 1, "currency": "USD"}')])[0]
    assert json.loads(kept.payload)["currency"] == "USD"


def test_unfixable_and_malformed_orders(fixes):
    negative, not_json, not_object = run_fix(
        fixes.add_default_currency, [record(b'{"amount": -5}'), record(b"<order/>"), record(b"[1]")]
    )
    assert not negative.ok
    assert not negative.malformed
    assert "amount -5" in negative.error
    assert not_json.malformed
    assert not not_object.ok


@pytest.mark.parametrize(
    ("error_class", "message", "properties", "rule"),
    [
        ("ValueError", "missing currency in order o-12", {}, "add-missing-currency"),
        (
            "TimeoutError",
            "inventory service timed out after 5000 ms for sku SKU-3",
            {},
            "retry-inventory-timeouts",
        ),
        (
            "json.decoder.JSONDecodeError",
            "Expecting value: line 1 column 1 (char 0)",
            {},
            "archive-unparseable-orders",
        ),
        (
            "SandboxOrderError",
            "sandbox order o-3 reached production",
            {"env": "sandbox"},
            "drop-sandbox-traffic",
        ),
        ("PricingError", "no price for sku SKU-404", {}, None),
        ("OrderRejected", "order o-5: amount must be positive", {}, None),
    ],
)
def test_example_playbook_routes_each_failure(error_class, message, properties, rule):
    playbook = load_playbook(str(EXAMPLES / "playbooks" / "orders.yaml"))
    match = playbook.first_match(MatchInput("sig", error_class, message, ORDERS, "ours", properties))
    assert (match.name if match else None) == rule
    assert playbook.payload_off("persistent://public/default/payments-sub-DLQ", None)
