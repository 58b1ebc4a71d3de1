"""The brokers of a service URL and the TCP check both the provider and the replay app run first."""

from __future__ import annotations

import socket

from pulsar_dlq_consumer.client import connect_errors, service_endpoints


def test_each_broker_of_a_service_url_gets_the_schemes_default_port() -> None:
    assert service_endpoints("pulsar://h1:6650, h2/x") == [("h1", 6650), ("h2", 6650)]
    assert service_endpoints("pulsar+ssl://[::1],b:7000") == [("::1", 6651), ("b", 7000)]
    assert service_endpoints("pulsar://") == []


def test_connect_errors_names_each_broker_and_stops_when_asked() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        closed = socket.create_server(("127.0.0.1", 0))
        gone = closed.getsockname()[1]
        closed.close()
        results = connect_errors(f"pulsar://127.0.0.1:{port},127.0.0.1:{gone}", 2.0)
        assert next(results) == ("127.0.0.1", port, None)
        host, refused_port, error = next(results)
    assert (host, refused_port) == ("127.0.0.1", gone)
    assert isinstance(error, ConnectionRefusedError)
