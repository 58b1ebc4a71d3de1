"""The one rule for secrets in the replay app's output (``spark_apps/dlq_replay/redaction.py``)."""

from __future__ import annotations

import pytest

from spark_apps.dlq_replay.errors import ReplayConfigError
from spark_apps.dlq_replay.redaction import (
    NOT_SHOWN,
    check_name,
    check_url,
    could_be_secret,
    register,
    register_argv,
    safe_url,
    scrub,
    shown,
)

JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJyZXBsYXllciJ9.Q2hlY2tTaWduYXR1cmVWYWx1ZQ"
RANDOM = "Zx8Kq2LmP0aR7tYw3NbV"  # 20 characters of a random secret
HEX = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"


@pytest.mark.parametrize(
    "value", [JWT, RANDOM, HEX, f"/tmp/{JWT}", f"@{RANDOM}", f"x,{JWT}", "k9F2mQ7rT4vX8zL1pB6n"]
)
def test_what_could_be_a_token_is_recognised(value):
    assert could_be_secret(value)
    assert shown(value) == NOT_SHOWN


@pytest.mark.parametrize(
    "value",
    [
        "dlq-replayer",
        "persistent://acme/orders/orders-service-DLQ",
        "OrdersService-V2-DLQ",
        "persistent://public/default/one-run-DLQ-c9b465d5ac",
        "ProcessOrderEvents2024",
        "PaymentEvents2024Q1-DLQ",
        "scheduled__2024-05-01T00:00:00+00:00",
        "manual__2024-05-01T12:34:56.789012+00:00",
        "3f1c9a0b-2d4e-4f81-9a0b-2d4e6f813f1c",
        "3f1c9a0b2d4e6f81",
        "/tmp/pytest-of-root/pytest-12/test_every_kind_of_bad_in0/playbooks/typo.yaml",
        "examples/playbooks/orders.yaml",
        "10%",
    ],
)
def test_names_paths_and_run_ids_are_shown(value):
    assert not could_be_secret(value)
    assert shown(value) == repr(value)


def test_safe_url_drops_credentials_query_and_fragment():
    assert safe_url(f"http://user:{JWT}@broker:8080/admin?token={JWT}#x") == "http://broker:8080/admin"
    assert safe_url("pulsar+ssl://[::1]:6651") == "pulsar+ssl://[::1]:6651"
    assert safe_url(f"https://auth.example.com/{RANDOM}") == "https://auth.example.com"
    assert safe_url("not a url") == NOT_SHOWN


@pytest.mark.parametrize(
    "url",
    [
        f"http://user:{JWT}@broker:8080",
        f"http://{JWT}@broker:8080",
        f"http://broker:8080?token={JWT}",
        f"http://broker:8080/#{JWT}",
        f"http://broker:8080/{JWT}",
        JWT,
    ],
)
def test_check_url_refuses_a_secret_in_any_part_and_never_shows_it(url):
    with pytest.raises(ReplayConfigError) as info:
        check_url("--admin-url", url, ("http://", "https://"), "http://broker:8080", "admin REST URL")
    assert JWT not in str(info.value)
    assert "--admin-url" in str(info.value)


def test_check_url_accepts_plain_urls():
    check_url("--admin-url", "https://broker.example.com:8443/base", ("http://", "https://"), "x")
    check_url("--service-url", "pulsar://b1:6650,b2:6650", ("pulsar://",), "x")


def test_check_name_refuses_a_token_as_a_name():
    check_name("--subscription", "dlq-replayer")
    with pytest.raises(ReplayConfigError, match="--subscription looks like a token") as info:
        check_name("--subscription", JWT)
    assert JWT not in str(info.value)


def test_scrub_removes_registered_values_jwts_and_url_credentials():
    register(["an-opaque-secret-value"])
    text = (
        f"token {JWT} in http://u:pw@broker:8080/x?token=abc and an-opaque-secret-value, "
        "topic persistent://acme/orders/o-DLQ"
    )
    scrubbed = scrub(text)
    for secret in (JWT, "u:pw", "token=abc", "an-opaque-secret-value"):
        assert secret not in scrubbed
    assert "persistent://acme/orders/o-DLQ" in scrubbed
    assert "http://***@broker:8080/x?***" in scrubbed


def test_register_argv_takes_what_could_be_secret_and_values_of_secret_named_options():
    register_argv(
        ["--subscription", "Qm9vbGVhbkFsZ2VicmExMjM0", "--my-password", "hunter2hunter2", "--topics", "t"]
    )
    assert scrub("Qm9vbGVhbkFsZ2VicmExMjM0 hunter2hunter2 t") == "*** *** t"
