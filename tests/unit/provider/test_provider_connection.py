"""The ``pulsar`` connection: parsing, errors that name the connection and the fix, secret hygiene."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest

from airflow_provider_dlq.get_provider_info import get_provider_info
from airflow_provider_dlq.hooks.backlog import AdminHttp
from airflow_provider_dlq.hooks.connection import KNOWN_EXTRAS, PulsarConnectionError, parse_pulsar_connection
from airflow_provider_dlq.hooks.pulsar import PulsarHook

TOKEN = "eyJhbGciOiJIUzI1NiJ9.c2VjcmV0LXRva2Vu.sig-never-print-me"


def parse(**fields):
    fields.setdefault("conn_type", "pulsar")
    return parse_pulsar_connection("my_pulsar", **fields)


@pytest.mark.parametrize(
    ("fields", "url"),
    [
        ({"host": "pulsar://localhost:6650"}, "pulsar://localhost:6650"),
        ({"host": "pulsar+ssl://broker:6651/"}, "pulsar+ssl://broker:6651"),
        ({"host": "pulsar://b1:6650,b2:6650"}, "pulsar://b1:6650,b2:6650"),
        ({"host": "broker"}, "pulsar://broker:6650"),
        ({"host": "broker", "port": 7000}, "pulsar://broker:7000"),
        ({"host": "broker:7001"}, "pulsar://broker:7001"),
        ({"host": "pulsar://broker:6650", "port": 0}, "pulsar://broker:6650"),  # what a form posts
        ({"host": "pulsar://broker:6650", "port": 6650}, "pulsar://broker:6650"),  # the UI form: both filled
        ({"host": "pulsar://broker", "port": 7000}, "pulsar://broker:7000"),
        ({"host": "pulsar://b1,b2:6650", "port": 6650}, "pulsar://b1:6650,b2:6650"),
        ({"host": "broker", "port": 0}, "pulsar://broker:6650"),
        ({"host": "broker", "extra": {"use_tls": True}}, "pulsar+ssl://broker:6651"),
        ({"host": "broker", "extra": {"use_tls": "true"}, "port": 9443}, "pulsar+ssl://broker:9443"),
        ({"host": "broker", "conn_type": "pulsar+ssl"}, "pulsar+ssl://broker:6651"),
        ({"host": "pulsar://[::1]:6650", "port": 6650}, "pulsar://[::1]:6650"),  # IPv6 with its port
        ({"host": "pulsar://[::1]", "port": 6650}, "pulsar://[::1]:6650"),
    ],
)
def test_service_url_from_host_port_and_tls(fields, url):
    assert parse(**fields).service_url == url


def test_extras_are_parsed_and_normalised():
    cfg = parse(
        host="pulsar://localhost:6650",
        password=TOKEN,
        extra={
            "admin_url": "http://localhost:8080/",
            "metrics_url": "http://127.0.0.1:8080/metrics",
            "tls_trust_certs_file_path": "/etc/pulsar/ca.pem",
            "tls_allow_insecure_connection": "false",
            "something_else": 1,
        },
    )
    assert cfg.admin_url == "http://localhost:8080"
    assert cfg.metrics_url == "http://127.0.0.1:8080/metrics"
    assert cfg.tls_trust_certs_file_path == "/etc/pulsar/ca.pem"
    assert cfg.tls_allow_insecure_connection is False
    assert cfg.token == TOKEN
    assert cfg.ignored_extras == ("something_else",)


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"host": ""}, "has no Host; set Host (Service URL) to a service URL"),
        ({"host": None}, "has no Host"),
        ({"host": "http://broker:8080"}, "http:// URLs belong in the extras"),
        ({"host": "pulsar://"}, "names no broker"),
        ({"host": "broker/path"}, "neither a service URL nor host[:port]"),
        ({"host": "broker:http"}, "neither a service URL nor host[:port]"),
        ({"host": "broker", "port": 70000}, "Port must be 1-65535"),
        ({"host": "pulsar://broker:6650", "port": 6651}, "contradicts the port 6650"),
        ({"host": "pulsar://b:6650", "extra": {"use_tls": True}}, "use a pulsar+ssl:// URL"),
        ({"host": "b", "extra": {"use_tls": "maybe"}}, "'use_tls' must be true or false"),
        ({"host": "b", "extra": {"admin_url": "localhost:8080"}}, "'admin_url' must be an http(s) URL"),
        ({"host": "b", "extra": {"metrics_url": 8080}}, "'metrics_url' must be a string URL"),
        ({"host": "b", "conn_type": "kafka"}, "needs conn_type 'pulsar'"),
        ({"host": "pulsar+ssl://b:6651", "extra": {"tls_cert_file_path": "c.pem"}}, "needs both extras"),
        (
            {"host": "pulsar://b:6650", "extra": {"tls_cert_file_path": "c", "tls_key_file_path": "k"}},
            "pulsar+ssl",
        ),
        ({"host": "b", "extra": {"oauth2_audience": "x"}}, "'oauth2_issuer_url' is not set"),
        ({"host": "b", "extra": {"oauth2_issuer_url": "https://auth"}}, "client ID in Login"),
        ({"host": "b", "login": "id", "extra": {"oauth2_issuer_url": "https://auth"}}, "client ID in Login"),
        (
            {
                "host": "b",
                "login": "id",
                "password": "secret",
                "extra": {"oauth2_issuer_url": "https://auth", "oauth2_credentials_file": "/c.json"},
            },
            "given twice",
        ),
        ({"host": "b", "extra": {"oauth2_issuer_url": "auth.example.com"}}, "must be an http(s) URL"),
    ],
)
def test_bad_connections_name_the_connection_and_the_fix(fields, fragment):
    with pytest.raises(PulsarConnectionError) as err:
        parse(**fields)
    assert "'my_pulsar'" in str(err.value)
    assert fragment in str(err.value)


def test_token_is_not_in_repr_of_config_or_hook(monkeypatch):
    cfg = parse(host="pulsar://localhost:6650", password=TOKEN)
    assert TOKEN not in repr(cfg)
    assert cfg.token == TOKEN
    monkeypatch.setenv(
        "AIRFLOW_CONN_MY_PULSAR",
        json.dumps({"conn_type": "pulsar", "host": "pulsar://localhost:6650", "password": TOKEN}),
    )
    hook = PulsarHook("my_pulsar")
    assert hook.config.token == TOKEN
    assert TOKEN not in repr(hook)
    assert TOKEN not in repr(hook.config)


def test_hook_reads_the_env_connection(monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_PULSAR_DEFAULT",
        json.dumps(
            {
                "conn_type": "pulsar",
                "host": "pulsar://localhost:6650",
                "extra": {"metrics_url": "http://m:1/metrics"},
            }
        ),
    )
    hook = PulsarHook()
    assert hook.pulsar_conn_id == "pulsar_default"
    assert hook.config.service_url == "pulsar://localhost:6650"
    sent = []

    def send(http, url, method="GET"):
        sent.append(url)
        return 200, "# TYPE pulsar_subscription_back_log gauge\n"

    monkeypatch.setattr(AdminHttp, "send", send)
    assert hook.get_backlog(["persistent://t/ns/x"], "sub")["persistent://t/ns/x"].source == "metrics"
    assert sent == ["http://m:1/metrics"]


def test_missing_connection_error_names_the_env_var():
    hook = PulsarHook("no_such_pulsar_conn")
    with pytest.raises(PulsarConnectionError) as err:
        _ = hook.config
    assert "'no_such_pulsar_conn' is not defined" in str(err.value)
    assert "AIRFLOW_CONN_NO_SUCH_PULSAR_CONN" in str(err.value)
    ok, message = hook.test_connection()
    assert ok is False
    assert "AIRFLOW_CONN_NO_SUCH_PULSAR_CONN" in message


def test_backlog_needs_admin_or_metrics_url(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_BARE", json.dumps({"conn_type": "pulsar", "host": "pulsar://h:6650"}))
    hook = PulsarHook("bare")
    with pytest.raises(ValueError, match="neither extra 'admin_url' nor 'metrics_url'") as err:
        hook.get_backlog(["orders-DLQ"], "dlq-replayer")
    assert "'bare'" in str(err.value)


def test_backlog_read_error_never_contains_the_token(monkeypatch, caplog):
    # Nothing listens on port 9 of 127.0.0.1: the read fails; neither the error nor the logs carry the token.
    monkeypatch.setenv(
        "AIRFLOW_CONN_TOK",
        json.dumps(
            {
                "conn_type": "pulsar",
                "host": "pulsar://127.0.0.1:6650",
                "password": TOKEN,
                "extra": {"metrics_url": "http://127.0.0.1:9/metrics"},
            }
        ),
    )
    caplog.set_level(logging.DEBUG)
    hook = PulsarHook("tok", http_timeout=2)
    with pytest.raises(RuntimeError, match=r"GET http://127\.0\.0\.1:9/metrics failed") as err:
        hook.get_backlog(["orders-DLQ"], "dlq-replayer")
    assert TOKEN not in str(err.value)
    assert TOKEN not in caplog.text


def test_ui_behaviour_in_provider_info_keeps_port_for_the_test_button():
    """Airflow (3.2+) reads the form's behaviour from provider info; the hook declares no method for it."""
    info = get_provider_info()["connection-types"][0]
    assert info["connection-type"] == PulsarHook.conn_type == "pulsar"
    assert info["hook-class-name"] == "airflow_provider_dlq.hooks.pulsar.PulsarHook"
    assert "get_ui_field_behaviour" not in PulsarHook.__dict__
    behaviour = info["ui-field-behaviour"]
    # Airflow 3.3's Test button posts port 0 for a connection stored without one, which its API answers
    # with HTTP 400: Port stays in the form, says the Test button needs it, and shows no bare number.
    assert behaviour["hidden-fields"] == ["schema"]
    assert "Test button" in behaviour["relabeling"]["port"]
    assert behaviour["placeholders"]["port"].startswith("required for Test")
    assert behaviour["relabeling"]["host"] == "Service URL"
    assert set(info["conn-fields"]) == set(KNOWN_EXTRAS)


def test_auth_methods_and_secrets_stay_out_of_repr():
    token = parse(host="pulsar://b:6650", password=TOKEN)
    assert token.auth_method == "token"
    assert token.secrets == (TOKEN,)
    oauth = parse(
        host="pulsar+ssl://b:6651",
        login="client-1",
        password="client-secret-value",
        extra={"oauth2_issuer_url": "https://auth.example.com/", "oauth2_audience": "urn:pulsar"},
    )
    assert oauth.auth_method == "oauth2"
    assert oauth.token is None  # Password is the client secret here, not a token
    assert oauth.oauth2 is not None
    assert oauth.oauth2.client_id == "client-1"
    assert oauth.secrets == ("client-secret-value",)
    assert "client-secret-value" not in repr(oauth)
    mtls = parse(
        host="pulsar+ssl://b:6651",
        extra={"tls_cert_file_path": "/c/client.pem", "tls_key_file_path": "/c/client.key"},
    )
    assert mtls.auth_method == "tls"
    both = parse(
        host="pulsar+ssl://b:6651",
        password=TOKEN,
        extra={"tls_cert_file_path": "/c/client.pem", "tls_key_file_path": "/c/client.key"},
    )
    assert both.auth_method == "token"  # the certificate is presented at the TLS layer (mutual TLS)
    kwargs = PulsarHook.client_auth_kwargs(both)
    assert kwargs["tls_cert_file_path"] == "/c/client.pem"
    assert kwargs["token"] == TOKEN
    assert "oauth2" not in kwargs
    assert PulsarHook.client_auth_kwargs(oauth)["oauth2"]["client_secret"] == "client-secret-value"


def test_login_without_oauth2_is_ignored_with_a_warning():
    cfg = parse(host="pulsar://b:6650", login="someone", password=TOKEN)
    assert cfg.ignored_login
    assert cfg.auth_method == "token"


def test_a_service_url_with_a_non_numeric_port_is_a_bad_port():
    with pytest.raises(PulsarConnectionError, match=r"has port 'abc'; a port is a number 1-65535"):
        parse(host="pulsar://host:abc")
    with pytest.raises(PulsarConnectionError, match=r"has port '70000'; a port is a number 1-65535"):
        parse(host="pulsar://[::1]:70000")
    with pytest.raises(PulsarConnectionError, match=r"make them equal \(Airflow's Test button needs Port\)"):
        parse(host="pulsar://broker:6650", port=6651)


def test_the_test_button_names_the_users_connection_not_the_transient_one():
    from airflow_provider_dlq.hooks.connection_check import tested_connection_id

    def test_connection(test_body):  # the shape of Airflow's route: a local `test_body`
        return tested_connection_id()

    assert test_connection(SimpleNamespace(connection_id="pulsar_orders")) == "pulsar_orders"
    assert tested_connection_id() is None


def test_airflows_test_route_still_has_the_shape_the_lookup_reads():
    """``tested_connection_id`` reads the ``test_body`` of Airflow's ``test_connection`` route: fails when
    an Airflow upgrade renames either (the Test button would then name the transient id again)."""
    import inspect

    from airflow.api_fastapi.core_api.datamodels.connections import ConnectionBody
    from airflow.api_fastapi.core_api.routes.public import connections

    assert "test_body" in inspect.signature(connections.test_connection).parameters
    assert "connection_id" in ConnectionBody.model_fields


def test_the_test_button_checks_the_admin_and_metrics_urls_and_lists_what_passed(monkeypatch, http_server):
    from http.server import BaseHTTPRequestHandler

    from airflow_provider_dlq.hooks import connection_check

    class Answers(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(403 if self.path == "/metrics" else 200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"[]")

    url = http_server(Answers)
    conn = {"conn_type": "pulsar", "host": "pulsar://127.0.0.1:6650",
            "extra": {"admin_url": url, "metrics_url": f"{url}/metrics"}}  # fmt: skip
    monkeypatch.setenv("AIRFLOW_CONN_CHECKED", json.dumps(conn))
    monkeypatch.setattr(connection_check, "check_reachable", lambda service_url: [])
    monkeypatch.setattr(connection_check, "check_broker", lambda hook, config: "broker ok")
    ok, message = PulsarHook("checked").test_connection()
    assert not ok
    assert message == (
        f"the metrics endpoint {url}/metrics returned HTTP 403 (passed: broker ok; admin API ok)"
    )
