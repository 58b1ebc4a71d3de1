"""End to end against Apache Pulsar with authentication, authorisation and TLS turned on.

The test makes its own CA, broker and client certificates (``cryptography``) and its own JWTs (HS256,
PyJWT), starts Apache Pulsar standalone with TLS-only ports, token and TLS authentication and
authorisation, and checks token auth over TLS and TLS client-certificate auth through the hook (client,
Test button, admin backlog over HTTPS), the trigger, and the Spark replay app. No secret may appear in
the logs, the run's files or the report.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import json
import logging
import secrets
import time
from pathlib import Path
from types import SimpleNamespace

import jwt
import pulsar
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TENANT_NS = "acme/dlq"
REPLAYER, TLS_ROLE, ADMIN = "replayer", "replayer-tls", "admin"


# --------------------------------------------------------------------------- certificates and tokens


def _key():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _write_key(key, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


def _cert(
    subject_cn: str, key, issuer_cert=None, issuer_key=None, *, ca=False, server=False
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject_cn)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_cert.subject if issuer_cert is not None else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    return builder.sign(issuer_key if issuer_key is not None else key, hashes.SHA256())


def make_pki(folder: Path) -> SimpleNamespace:
    """A CA, a broker certificate for 127.0.0.1 and a client certificate whose CN is the TLS role."""
    ca_key = _key()
    ca = _cert("dlq-test-ca", ca_key, ca=True)
    server_key, client_key = _key(), _key()
    server = _cert("127.0.0.1", server_key, ca, ca_key, server=True)
    client = _cert(TLS_ROLE, client_key, ca, ca_key)
    paths = SimpleNamespace(
        ca=folder / "ca.pem",
        server=folder / "broker.pem",
        server_key=folder / "broker.key",
        client=folder / "client.pem",
        client_key=folder / "client.key",
    )
    paths.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths.server.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths.client.write_bytes(client.public_bytes(serialization.Encoding.PEM))
    _write_key(server_key, paths.server_key)
    _write_key(client_key, paths.client_key)
    return paths


def token_for(secret: bytes, role: str) -> str:
    return jwt.encode({"sub": role}, secret, algorithm="HS256")


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory):
    """Apache Pulsar with TLS-only ports, token + TLS authentication and authorisation."""
    from pulsar_standalone import free_port, start_standalone

    folder = tmp_path_factory.mktemp("pulsar-auth")
    pki = make_pki(folder)
    secret = secrets.token_bytes(32)
    (folder / "secret.key").write_bytes(secret)
    admin_token = token_for(secret, ADMIN)
    overrides = {
        "brokerServicePort": "",
        "webServicePort": "",
        "brokerServicePortTls": free_port(),
        "webServicePortTls": free_port(),
        "tlsCertificateFilePath": pki.server,
        "tlsKeyFilePath": pki.server_key,
        "tlsTrustCertsFilePath": pki.ca,
        "tlsAllowInsecureConnection": "false",
        "tlsRequireTrustedClientCertOnConnect": "false",
        "authenticationEnabled": "true",
        "authenticationProviders": "org.apache.pulsar.broker.authentication.AuthenticationProviderToken,"
        "org.apache.pulsar.broker.authentication.AuthenticationProviderTls",
        "authorizationEnabled": "true",
        "superUserRoles": ADMIN,
        "tokenSecretKey": f"file://{folder / 'secret.key'}",
        "brokerClientTlsEnabled": "true",
        "brokerClientTrustCertsFilePath": pki.ca,
        "brokerClientAuthenticationPlugin": "org.apache.pulsar.client.impl.auth.AuthenticationToken",
        "brokerClientAuthenticationParameters": f"token:{admin_token}",
    }
    broker = start_standalone(
        conf_overrides=overrides, admin_token=admin_token, tls_trust_certs_file=str(pki.ca)
    )
    try:
        admin = broker.admin()
        admin.create_tenant("acme")
        admin.create_namespace(TENANT_NS)
        for role in (REPLAYER, TLS_ROLE):
            admin.request(
                "POST", f"/admin/v2/namespaces/{TENANT_NS}/permissions/{role}", ["produce", "consume"]
            )
        yield SimpleNamespace(broker=broker, pki=pki, secret=secret, admin_token=admin_token, folder=folder)
    finally:
        broker.stop()


def admin_client(secure) -> pulsar.Client:
    return pulsar.Client(
        secure.broker.service_url,
        authentication=pulsar.AuthenticationToken(secure.admin_token),
        tls_trust_certs_file_path=str(secure.pki.ca),
        logger=logging.getLogger("pulsar.test"),
        operation_timeout_seconds=15,
    )


def fill(secure, count: int = 4) -> str:
    """``count`` DLQ messages (our error context) on a fresh topic of the secured namespace."""
    from pulsar_dlq_consumer import DeadLetterPolicy, DlqConsumer

    origin = f"persistent://{TENANT_NS}/orders-{secrets.token_hex(4)}"
    client = admin_client(secure)
    try:
        service = DlqConsumer(
            client,
            origin,
            "orders-service",
            dead_letter_policy=DeadLetterPolicy(initial_subscription_name="dlq-replayer"),
            initial_position=pulsar.InitialPosition.Earliest,
        )
        producer = client.create_producer(origin)
        for i in range(count):
            producer.send(json.dumps({"order": i}).encode())
        producer.close()
        for _ in range(count):
            service.term(service.receive(timeout_millis=15_000), TimeoutError("payment timed out"))
        service.flush()
        dlq = service.dead_letter_topic
        service.close()
        return dlq
    finally:
        client.close()


def set_conn(monkeypatch, conn_id: str, conn: dict) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))


def token_conn(secure, token: str, **extra) -> dict:
    return {
        "conn_type": "pulsar",
        "host": secure.broker.service_url,
        "password": token,
        "extra": {
            "admin_url": secure.broker.admin_url,
            "tls_trust_certs_file_path": str(secure.pki.ca),
            **extra,
        },
    }


def mtls_conn(secure, **extra) -> dict:
    return {
        "conn_type": "pulsar",
        "host": secure.broker.service_url,
        "extra": {
            "admin_url": secure.broker.admin_url,
            "tls_trust_certs_file_path": str(secure.pki.ca),
            "tls_cert_file_path": str(secure.pki.client),
            "tls_key_file_path": str(secure.pki.client_key),
            **extra,
        },
    }


# --------------------------------------------------------------------------- hook, Test button, trigger


def test_token_auth_over_tls_hook_test_button_backlog_and_trigger(secure_broker, monkeypatch, caplog):
    from airflow_provider_dlq.hooks.pulsar import PulsarHook
    from airflow_provider_dlq.triggers.backlog import DlqBacklogTrigger

    secure = secure_broker
    assert secure.broker.service_url.startswith("pulsar+ssl://")
    token = token_for(secure.secret, REPLAYER)
    dlq = fill(secure)
    set_conn(monkeypatch, "pulsar_tok", token_conn(secure, token, test_topic=dlq))
    with caplog.at_level(logging.DEBUG):
        ok, message = PulsarHook("pulsar_tok").test_connection()
        assert ok, message
        assert "token auth" in message
        backlog = PulsarHook("pulsar_tok").get_backlog([dlq], "dlq-replayer")
        assert backlog[dlq].backlog == 4
        assert backlog[dlq].source == "admin"
        trigger = DlqBacklogTrigger(topics=[dlq], subscription="dlq-replayer", pulsar_conn_id="pulsar_tok",
                                    poll_interval=1, deadline=time.time() + 60)  # fmt: skip

        async def first_event():
            async for event in trigger.run():
                return event.payload
            return None

        payload = asyncio.run(first_event())
        assert payload["status"] == "success", payload
        assert payload["ready"] == [dlq]
    assert token not in caplog.text
    assert token not in message

    # A tenant-scoped token is not authorised on public/default: without test_topic the test still
    # passes (the broker authenticated it) and says why.
    set_conn(monkeypatch, "pulsar_scoped", token_conn(secure, token))
    ok, message = PulsarHook("pulsar_scoped").test_connection()
    assert ok, message
    assert "not authorised on public/default" in message

    # A token the broker did not sign, and no credentials at all, fail with the URL and the cause.
    forged = jwt.encode({"sub": REPLAYER}, secrets.token_bytes(32), algorithm="HS256")
    set_conn(monkeypatch, "pulsar_forged", token_conn(secure, forged, test_topic=dlq))
    ok, message = PulsarHook("pulsar_forged").test_connection()
    assert not ok
    assert secure.broker.service_url in message
    assert forged not in message
    conn = token_conn(secure, "", test_topic=dlq)
    conn.pop("password")
    set_conn(monkeypatch, "pulsar_anon", conn)
    ok, message = PulsarHook("pulsar_anon").test_connection()
    assert not ok
    assert secure.broker.service_url in message


def test_tls_client_certificate_auth_hook_backlog_and_test_button(secure_broker, monkeypatch):
    from airflow_provider_dlq.hooks.pulsar import PulsarHook

    secure = secure_broker
    dlq = fill(secure, count=3)
    set_conn(monkeypatch, "pulsar_mtls", mtls_conn(secure, test_topic=dlq))
    hook = PulsarHook("pulsar_mtls")
    assert hook.config.auth_method == "tls"
    ok, message = hook.test_connection()
    assert ok, message
    assert "TLS client certificate auth" in message
    assert hook.get_backlog([dlq], "dlq-replayer")[dlq].backlog == 3
    client = hook.get_client(operation_timeout_seconds=15)
    try:
        reader = client.create_reader(dlq, pulsar.MessageId.earliest)
        assert (
            reader.read_next(timeout_millis=15_000)
            .properties()["__dlq.errors.exception.class"]
            .endswith("TimeoutError")
        )
        reader.close()
    finally:
        client.close()
    # Without the client certificate the broker refuses the anonymous client.
    set_conn(
        monkeypatch,
        "pulsar_nocert",
        {
            **mtls_conn(secure, test_topic=dlq),
            "extra": {
                "admin_url": secure.broker.admin_url,
                "tls_trust_certs_file_path": str(secure.pki.ca),
                "test_topic": dlq,
            },
        },
    )
    ok, message = PulsarHook("pulsar_nocert").test_connection()
    assert not ok
    assert secure.broker.service_url in message


# --------------------------------------------------------------------------- the Spark replay app


@pytest.mark.parametrize("auth", ["token-file", "client-certificate"])
def test_replay_app_reads_a_secured_dlq_and_keeps_secrets_out(secure_broker, spark, tmp_path, auth, caplog):
    from spark_apps.dlq_replay import outcomes as oc
    from spark_apps.dlq_replay.options import ReplayOptions
    from spark_apps.dlq_replay.runner import run_replay

    secure = secure_broker
    dlq = fill(secure, count=5)
    token = token_for(secure.secret, REPLAYER)
    credentials: dict[str, str] = {}
    if auth == "token-file":
        token_file = tmp_path / "token"
        token_file.write_text(token)
        token_file.chmod(0o600)
        credentials["auth_token_file"] = str(token_file)
    else:
        credentials.update(tls_cert_file=str(secure.pki.client), tls_key_file=str(secure.pki.client_key))
    out = tmp_path / "out"
    options = ReplayOptions(
        run_id=f"secure-{auth}",
        output_dir=str(out),
        service_url=secure.broker.service_url,
        topics=(dlq,),
        mode=oc.DRY_RUN,
        tls_trust_certs_file=str(secure.pki.ca),
        **credentials,
    )
    with caplog.at_level(logging.DEBUG):
        report = run_replay(spark, options)
    assert report["totals"]["snapshot"] == 5
    assert report["status"] == "succeeded"
    written = "".join(
        p.read_text(errors="replace")
        for p in out.rglob("*")
        if p.is_file() and p.suffix in (".json", ".html")
    )
    assert token not in written
    assert token not in caplog.text
    assert secure.pki.client_key.read_text() not in written


def test_replay_app_refuses_a_wrong_token_at_once_naming_authentication(secure_broker, tmp_path):
    """A token the broker does not accept is an authentication error in seconds (exit 2, nothing
    written, before Spark starts), not a minute-long wait for a lease "held by another run". The command
    line runs in its own process, as in production: the Pulsar client's log, which tells a refused
    handshake from silence, is the process's first client's."""
    import os
    import subprocess
    import sys

    secure = secure_broker
    dlq = fill(secure, count=1)
    wrong = token_for(secrets.token_bytes(32), REPLAYER)  # signed with another key
    out = tmp_path / "out"
    argv = [
        "--run-id", "wrong-token", "--service-url", secure.broker.service_url, "--topics", dlq,
        "--output-dir", str(out), "--tls-trust-certs-file", str(secure.pki.ca),
    ]  # fmt: skip
    repo = Path(__file__).resolve().parents[3]
    main = repo / "spark_apps" / "dlq_replay_main.py"  # the app's entry point, as spark-submit runs it
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(main), *argv],
        env={**os.environ, "PULSAR_AUTH_TOKEN": wrong},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=repo,
    )
    elapsed = time.monotonic() - started
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "refused this run's authentication" in proc.stderr
    assert "PULSAR_AUTH_TOKEN" in proc.stderr
    assert "did not grant" not in proc.stderr
    assert "another replay run" not in proc.stderr
    assert elapsed < 30, elapsed
    assert wrong not in proc.stdout + proc.stderr
    assert not out.exists()
