"""Checks against the broker before a replay writes anything, each in seconds: something listens at the
service URL (exit 1), the broker accepts the credentials (a partitioned-metadata lookup, which creates
nothing; exit 2), and every DLQ topic exists (asked of the admin REST, when given)."""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

from pulsar_dlq_consumer.client import connect_errors, create_client
from spark_apps.dlq_replay.errors import ReplayConfigError, ReplayError
from spark_apps.dlq_replay.pulsar_io.admin import AdminUnavailable, PulsarAdmin
from spark_apps.dlq_replay.pulsar_io.conf import client_auth_kwargs, client_logger
from spark_apps.dlq_replay.pulsar_io.window import parse_topics
from spark_apps.dlq_replay.redaction import NOT_SHOWN, could_be_secret, register, safe_url

if TYPE_CHECKING:
    from collections.abc import Sequence

    from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf

log = logging.getLogger("spark_apps.dlq_replay")

#: Seconds to open a TCP connection to the broker, and for the credentials lookup.
CONNECT_TIMEOUT_S = 5.0
LOOKUP_TIMEOUT_S = 10
#: Seconds for each admin REST request of the checks (a silent admin URL is refused after this).
ADMIN_TIMEOUT_S = 10.0


class BrokerUnreachableError(ReplayError):
    """Nothing answers at the service URL (exit code 1: nothing was written; re-run when it is up)."""


def check_listening(service_url: str) -> None:
    """Raise :class:`BrokerUnreachableError` unless some ``host:port`` of ``service_url`` accepts TCP."""
    failures = []
    for host, port, error in connect_errors(service_url, CONNECT_TIMEOUT_S):
        if error is None:
            return
        failures.append(f"{host}:{port} ({error.strerror or type(error).__name__})")
    raise BrokerUnreachableError(
        f"nothing is listening at {', '.join(failures) or safe_url(service_url)}: no Apache Pulsar broker "
        "answers at --service-url. Check the host and port (e.g. pulsar://broker:6650, pulsar+ssl://broker:"
        "6651) and that the broker is running; nothing was written, re-run when it is up"
    )


class _ConnectionLog(logging.Handler):
    """The client's connection events: only its log tells a handshake refused (and retried) from a timeout."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.opened = self.closed = 0
        self.tls_failures: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "Connected to broker" in text:
            self.opened += 1
        elif "Connection disconnected" in text or "Connection closed" in text:
            self.closed += 1
        elif "Handshake failed" in text or ("handshake" in text.lower() and record.levelno >= logging.ERROR):
            self.tls_failures.append(text[-200:])


def lookup_partitions(conf: PulsarConf, topics: Sequence[str]) -> dict[str, bool]:
    """Whether each topic is partitioned (so exists), looked up with the run's credentials."""
    import pulsar

    kwargs = client_auth_kwargs(conf, operation_timeout_seconds=LOOKUP_TIMEOUT_S)
    register([kwargs.get("token")])  # never printed, whatever prints the client's errors
    # The C++ client takes the Python logger of the first client of the process for every client: this
    # one uses the app's client logger like the others, listened to (and kept quiet) during the check.
    logger = client_logger()
    level, propagate = logger.level, logger.propagate
    events = _ConnectionLog()
    logger.setLevel(logging.INFO)
    logger.propagate = False
    logger.addHandler(events)
    client: Any = create_client(conf.service_url, logger=logger, **kwargs)
    topic = ""
    try:
        partitioned = {}
        for topic in topics:
            names = [str(name) for name in client.get_topic_partitions(topic)]
            partitioned[topic] = bool(names) and names != [topic]
        return partitioned
    except pulsar.AuthorizationError:
        raise ReplayConfigError(
            f"this run's role may not look up DLQ topic {_named(topic)} (AuthorizationError): grant it "
            "consume on the topic (pulsar-admin topics grant-permission --role <role> --actions consume "
            "<topic>), see the permissions table in docs/apache-pulsar.md; nothing was written"
        ) from None
    except pulsar.AuthenticationError as exc:
        raise _refused(conf, topic, type(exc).__name__) from None
    except (pulsar.Timeout, pulsar.ConnectError, pulsar.NotConnected) as exc:
        if events.tls_failures:
            raise ReplayConfigError(
                f"the TLS handshake with {safe_url(conf.service_url)} failed ({events.tls_failures[-1]}): "
                "check --tls-trust-certs-file (the CA of the broker's certificate) and, for a client "
                "certificate, --tls-cert-file and --tls-key-file"
            ) from None
        if events.opened and events.closed >= events.opened:
            how = f"the broker closed all {events.opened} connections in the handshake"
            raise _refused(conf, topic, how) from None
        raise BrokerUnreachableError(
            f"the broker at {safe_url(conf.service_url)} accepted the connection but did not answer a "
            f"topic lookup within {LOOKUP_TIMEOUT_S} s ({type(exc).__name__}): check that --service-url is "
            "the binary-protocol port (6650, or 6651 for pulsar+ssl://; not the admin port 8080); nothing "
            "was written, re-run when the broker answers"
        ) from None
    finally:
        # shutdown() after close(): a client refused in the handshake still has reconnect work pending.
        with contextlib.suppress(Exception):
            client.close()
        with contextlib.suppress(Exception):
            client.shutdown()
        # The error's traceback keeps this frame: drop the client here, not during interpreter shutdown.
        client = None
        logger.removeHandler(events)
        logger.setLevel(level)
        logger.propagate = propagate


def _refused(conf: PulsarConf, topic: str, how: str) -> ReplayConfigError:
    return ReplayConfigError(
        f"the broker at {safe_url(conf.service_url)} refused this run's authentication ({how}) looking up "
        f"DLQ topic {_named(topic)}: check the token (PULSAR_AUTH_TOKEN or --auth-token-file: not "
        "expired, signed for this cluster), the OAuth2 or client-certificate settings, and that the role "
        "may consume the DLQ's namespace; nothing was written"
    )


def _named(topic: str) -> str:
    return NOT_SHOWN if could_be_secret(topic) else topic


def check_topics_exist(conf: PulsarConf, topics: Sequence[str], partitioned: dict[str, bool]) -> None:
    """Refuse a DLQ topic the admin REST does not know (without ``--admin-url``, partitioned ones only)."""
    missing = [t for t in topics if not partitioned.get(t)]
    if not missing:
        return
    if not conf.admin_url:
        log.info(
            "no --admin-url: the existence of %s cannot be checked without creating it (a misspelt "
            "non-partitioned DLQ topic is an empty one to the binary protocol)",
            ", ".join(missing),
        )
        return
    admin = PulsarAdmin(conf, timeout_s=ADMIN_TIMEOUT_S)
    try:
        absent = [t for t in missing if not admin.topic_exists(t)]
    except AdminUnavailable as exc:
        log.warning("the admin URL is not Apache Pulsar's admin REST (%s); topic existence not checked", exc)
        return
    if absent:
        names = ", ".join(_named(t) for t in absent)
        raise ReplayConfigError(
            f"DLQ topic {names} does not exist on the broker (admin REST at {safe_url(conf.admin_url)}); "
            "check the spelling, tenant and namespace in --topics (a partitioned topic is named without "
            "-partition-N). Nothing was created"
        )


def check_broker(conf: PulsarConf, topics: Sequence[str]) -> None:
    """The checks of the module docstring, in order."""
    names = parse_topics(list(topics))
    check_listening(conf.service_url)
    check_topics_exist(conf, names, lookup_partitions(conf, names))
