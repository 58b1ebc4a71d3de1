"""The admin REST pieces both the provider and the replay app use: topic paths, the TLS context, and OAuth2
access tokens fetched with the standard library from a real (loopback) issuer."""

from __future__ import annotations

import json
import socket
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

import pytest

from pulsar_dlq_consumer.admin import ClientCredentials, OAuth2Error, admin_path, fetch, ssl_context

SECRET = "s3cr3t-client-secret"


def test_admin_path_quotes_each_part_and_gives_a_namespace() -> None:
    assert admin_path("persistent://t/ns/a b") == "/admin/v2/persistent/t/ns/a%20b"
    assert admin_path("persistent://t/ns/*-DLQ", parts=2) == "/admin/v2/persistent/t/ns"


def test_ssl_context_verifies_unless_insecure() -> None:
    assert ssl_context().verify_mode == ssl.CERT_REQUIRED
    assert ssl_context(allow_insecure=True).verify_mode == ssl.CERT_NONE


class _Issuer(BaseHTTPRequestHandler):
    forms: list[dict[str, str]] = []

    def log_message(self, *args: object) -> None:  # keep the test output clean
        pass

    def _send(self, status: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._send(200, {"token_endpoint": f"http://{self.headers['Host']}/token"})

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"])).decode()
        form = {k: v[0] for k, v in parse_qs(body).items()}
        type(self).forms.append(form)
        if form.get("client_secret") != SECRET:
            self._send(401, {"error": "invalid_client"})
        else:
            self._send(200, {"access_token": "access-1", "expires_in": 3600})


@pytest.fixture
def issuer() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Issuer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Issuer.forms = []
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_access_token_is_fetched_once_and_cached(issuer: str, tmp_path: Path) -> None:
    settings = {"issuer_url": issuer, "client_id": "c1", "client_secret": SECRET, "audience": "urn:p"}
    credentials = ClientCredentials(settings)
    assert [credentials.access_token(), credentials.access_token()] == ["access-1", "access-1"]
    assert _Issuer.forms == [
        {"grant_type": "client_credentials", "client_id": "c1", "client_secret": SECRET, "audience": "urn:p"}
    ]
    key_file = tmp_path / "oauth2.json"
    key_file.write_text(json.dumps({"client_id": "c2", "client_secret": SECRET}))
    assert ClientCredentials({"issuer_url": issuer, "credentials_file": str(key_file)}).access_token()
    assert SECRET not in repr(credentials)


def test_errors_name_the_url_and_the_fix_never_the_secret(issuer: str, tmp_path: Path) -> None:
    wrong = ClientCredentials({"issuer_url": issuer, "client_id": "c1", "client_secret": "wrong"})
    with pytest.raises(
        OAuth2Error, match=r"token request to .*/token returned HTTP 401; check the client"
    ) as err:
        wrong.access_token()
    assert "wrong" not in str(err.value)
    with pytest.raises(
        OAuth2Error, match=r"needs client_id and client_secret in the settings \(or a credentials file\)"
    ):
        ClientCredentials({"issuer_url": issuer, "client_id": "c1"}).access_token()
    bad_file = tmp_path / "oauth2.json"
    bad_file.write_text("not json")
    with pytest.raises(OAuth2Error, match=r"cannot read the OAuth2 credentials file .* as JSON"):
        ClientCredentials({"issuer_url": issuer, "credentials_file": str(bad_file)}).access_token()
    with socket.create_server(("127.0.0.1", 0)) as closed:
        gone = closed.getsockname()[1]
    with pytest.raises(OAuth2Error, match=rf"OAuth2 issuer http://127.0.0.1:{gone} unreachable"):
        ClientCredentials(
            {"issuer_url": f"http://127.0.0.1:{gone}", "client_id": "c", "client_secret": "s"}
        ).access_token()


class _Broker(BaseHTTPRequestHandler):
    """``/elsewhere`` redirects (307) to ``/owner``, which answers with the request's method and token."""

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        if self.path == "/elsewhere":
            self.send_response(307)
            self.send_header("Location", "/owner")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = json.dumps({"method": self.command, "auth": self.headers.get("Authorization")}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_a_bodiless_post_follows_a_307_to_the_topic_owner_with_its_method_and_token() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Broker)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/elsewhere"
        status, body = fetch(url, token="t-1", method="POST", timeout_s=5)
    finally:
        server.shutdown()
        server.server_close()
    assert (status, json.loads(body)) == (200, {"method": "POST", "auth": "Bearer t-1"})
