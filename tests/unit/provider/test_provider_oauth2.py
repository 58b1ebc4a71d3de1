"""OAuth2 client credentials: passed through to pulsar-client, and access tokens for the admin/metrics
HTTP calls fetched from a real (loopback) token endpoint."""

from __future__ import annotations

import base64
import json
import threading
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

import pytest

from airflow_provider_dlq.hooks.connection import OAuth2Settings
from pulsar_dlq_consumer.admin import ClientCredentials, OAuth2Error
from pulsar_dlq_consumer.client import create_client, oauth2_params

SECRET = "s3cr3t-client-secret"


def test_params_carry_credentials_in_memory_or_by_file():
    params = json.loads(
        oauth2_params(
            {"issuer_url": "https://auth/", "audience": "urn:p", "client_id": "c1", "client_secret": SECRET}
        )
    )
    assert params["issuer_url"] == "https://auth/"
    assert params["audience"] == "urn:p"
    prefix = "data:application/json;base64,"
    assert params["private_key"].startswith(prefix)
    assert json.loads(base64.b64decode(params["private_key"][len(prefix) :])) == {
        "client_id": "c1",
        "client_secret": SECRET,
    }
    by_file = json.loads(
        oauth2_params({"issuer_url": "https://auth/", "credentials_file": "/etc/oauth2.json"})
    )
    assert by_file == {"issuer_url": "https://auth/", "private_key": "/etc/oauth2.json"}
    with pytest.raises(ValueError, match="client_id and client_secret"):
        oauth2_params({"issuer_url": "https://auth/", "client_id": "c1"})
    with pytest.raises(ValueError, match="unknown OAuth2 settings"):
        oauth2_params({"issuer_url": "https://auth/", "private_key": "x"})


def test_create_client_builds_an_oauth2_client_and_refuses_two_methods():
    client = create_client(
        "pulsar+ssl://127.0.0.1:1",
        oauth2={"issuer_url": "https://auth/", "client_id": "c", "client_secret": SECRET},
    )
    client.close()
    with pytest.raises(ValueError, match="either token= or oauth2="):
        create_client("pulsar://127.0.0.1:1", token="t", oauth2={"issuer_url": "https://auth/"})


class _Issuer(BaseHTTPRequestHandler):
    requests: list[dict] = []
    bearers: list[str | None] = []

    def log_message(self, *args):  # keep the test output clean
        pass

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        type(self).bearers.append(self.headers["Authorization"])
        host = self.headers["Host"]
        self._send(200, {"issuer": f"http://{host}", "token_endpoint": f"http://{host}/oauth/token"})

    def do_POST(self):
        form = {
            k: v[0]
            for k, v in parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode()).items()
        }
        type(self).requests.append(form)
        if form.get("client_secret") != SECRET:
            self._send(401, {"error": "invalid_client"})
        else:
            self._send(200, {"access_token": "access-1", "expires_in": 3600, "token_type": "Bearer"})


@pytest.fixture
def issuer():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Issuer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Issuer.requests = []
    _Issuer.bearers = []
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_access_token_is_fetched_once_and_cached(issuer, tmp_path):
    settings = OAuth2Settings(
        issuer_url=issuer, client_id="c1", client_secret=SECRET, audience="urn:p", scope="s"
    )
    credentials = ClientCredentials(asdict(settings))

    def fetch(credentials):
        return [credentials.access_token(), credentials.access_token()]

    assert fetch(credentials) == ["access-1", "access-1"]
    assert _Issuer.requests == [
        {
            "grant_type": "client_credentials",
            "client_id": "c1",
            "client_secret": SECRET,
            "audience": "urn:p",
            "scope": "s",
        }
    ]
    key_file = tmp_path / "oauth2.json"
    key_file.write_text(json.dumps({"client_id": "c2", "client_secret": SECRET}))
    by_file = ClientCredentials(asdict(OAuth2Settings(issuer_url=issuer, credentials_file=str(key_file))))
    assert fetch(by_file) == ["access-1", "access-1"]
    wrong = ClientCredentials(
        asdict(OAuth2Settings(issuer_url=issuer, client_id="c1", client_secret="wrong"))
    )
    with pytest.raises(OAuth2Error) as err:
        fetch(wrong)
    assert "HTTP 401" in str(err.value)
    assert "wrong" not in str(err.value)


def test_hook_sends_the_access_token_to_the_admin_api(issuer, monkeypatch):
    """The hook's admin requests carry ``Authorization: Bearer <access token>`` (never the secret)."""
    from airflow_provider_dlq.hooks.pulsar import PulsarHook

    conn = {"conn_type": "pulsar", "host": "pulsar://127.0.0.1:6650", "login": "c1", "password": SECRET,
            "extra": {"oauth2_issuer_url": issuer, "admin_url": issuer}}  # fmt: skip
    monkeypatch.setenv("AIRFLOW_CONN_PULSAR_OAUTH", json.dumps(conn))
    hook = PulsarHook("pulsar_oauth")

    http = hook.admin_http(hook.config)
    assert http.send(f"{issuer}/admin/v2/clusters")[0] == 200
    assert _Issuer.bearers == [None, "Bearer access-1"]  # discovery, then the admin request
    assert SECRET not in repr(http)
