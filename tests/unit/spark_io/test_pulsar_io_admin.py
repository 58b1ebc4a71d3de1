"""The replay's admin REST reads against a loopback server playing the OAuth2 issuer and the admin REST:
the access token is fetched once and sent as the bearer, and each refusal names its fix."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from spark_apps.dlq_replay.pulsar_io.admin import AdminNotFound, PulsarAdmin
from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf
from spark_apps.dlq_replay.pulsar_io.errors import PulsarConfigError, PulsarIOError

SECRET = "s3cr3t-client-secret"
STATS = "/admin/v2/persistent/t/ns/dlq/stats"


class _Server(BaseHTTPRequestHandler):
    tokens_issued = 0
    failures = 0

    def log_message(self, *args: object) -> None:  # keep the test output clean
        pass

    def _send(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        host = self.headers["Host"]
        if self.path == "/.well-known/openid-configuration":
            return self._send(200, {"token_endpoint": f"http://{host}/token"})
        if self.headers.get("Authorization") != "Bearer access-1":
            return self._send(401, {"reason": "unauthorized"})
        if self.path == STATS and type(self).failures:
            type(self).failures -= 1
            return self._send(503, {"reason": "busy"})
        if self.path == STATS:
            return self._send(200, {"subscriptions": {}})
        return self._send(404, {"reason": "Topic not found"})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).tokens_issued += 1
        self._send(200, {"access_token": "access-1", "expires_in": 3600})


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    _Server.tokens_issued, _Server.failures = 0, 0
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_oauth2_token_is_the_bearer_and_errors_name_the_fix(server: str, monkeypatch) -> None:
    monkeypatch.setenv("PULSAR_OAUTH2_CREDENTIALS", json.dumps({"client_id": "c", "client_secret": SECRET}))
    conf = PulsarConf("pulsar://127.0.0.1:1", admin_url=server, oauth2_issuer_url=server)
    admin = PulsarAdmin(conf, timeout_s=5.0)
    _Server.failures = 1  # a server error is retried
    assert admin.stats("persistent://t/ns/dlq") == {"subscriptions": {}}
    with pytest.raises(AdminNotFound, match="HTTP 404 \\(Topic not found\\)"):
        admin.stats("persistent://t/ns/missing")
    assert not admin.topic_exists("persistent://t/ns/missing")
    assert _Server.tokens_issued == 1
    unauthenticated = PulsarAdmin(PulsarConf("pulsar://127.0.0.1:1", admin_url=server, token_env=None))
    with pytest.raises(PulsarConfigError, match="HTTP 401; the admin REST refused the token"):
        unauthenticated.stats("persistent://t/ns/dlq")
    _Server.failures = 3
    with pytest.raises(PulsarIOError, match="HTTP 503"):
        admin.stats("persistent://t/ns/dlq")


def test_an_unreachable_issuer_or_admin_url_is_a_configuration_error(monkeypatch) -> None:
    monkeypatch.setenv("PULSAR_OAUTH2_CREDENTIALS", json.dumps({"client_id": "c", "client_secret": SECRET}))
    dead = "http://127.0.0.1:9"
    with pytest.raises(PulsarConfigError, match=f"OAuth2 issuer {dead} unreachable") as err:
        PulsarAdmin(PulsarConf("pulsar://127.0.0.1:1", admin_url=dead, oauth2_issuer_url=dead), timeout_s=2.0)
    assert SECRET not in str(err.value)
    with pytest.raises(PulsarConfigError, match="cannot reach the Pulsar admin REST"):
        PulsarAdmin(PulsarConf("pulsar://127.0.0.1:1", admin_url=dead), timeout_s=2.0).get(
            "/admin/v2/clusters"
        )
