"""Pure logic of the Pulsar I/O layer: readable ids, window order, topic names, window JSON, options."""

from __future__ import annotations

import json

import pytest

from pulsar_dlq_consumer.errors import ConfigurationError
from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf
from spark_apps.dlq_replay.pulsar_io.errors import PulsarConfigError, WindowError
from spark_apps.dlq_replay.pulsar_io.ids import in_window, message_id_key, message_id_str
from spark_apps.dlq_replay.pulsar_io.window import (
    PartitionWindow,
    expand_partitions,
    normalize_topic,
    parse_topics,
    partition_index,
    unique_consumer_name,
    windows_from_json,
    windows_to_json,
)


class FakeId:
    def __init__(self, ledger: int, entry: int, partition: int, batch: int) -> None:
        self._v = (ledger, entry, partition, batch)

    def ledger_id(self) -> int:
        return self._v[0]

    def entry_id(self) -> int:
        return self._v[1]

    def partition(self) -> int:
        return self._v[2]

    def batch_index(self) -> int:
        return self._v[3]


def test_message_id_str_and_key_round_trip():
    assert message_id_str(FakeId(12, 345, -1, -1), -1) == "12:345:-1:-1"
    assert message_id_str(FakeId(12, 345, -1, 7), partition=3) == "12:345:3:7"
    assert message_id_key("12:345:3:7") == (12, 345, 3, 7)


@pytest.mark.parametrize("bad", ["", "1:2:3", "1:2:3:4:5", "a:2:3:4", None])
def test_message_id_key_rejects_malformed_ids_with_the_format(bad):
    with pytest.raises(ValueError, match="<ledger>:<entry>:<partition>:<batch_index>"):
        message_id_key(bad)


def test_message_id_key_orders_like_the_broker():
    ids = ["3:0:-1:-1", "2:10:-1:-1", "2:9:-1:5", "2:9:-1:0", "10:0:-1:-1"]
    assert sorted(ids, key=message_id_key) == [
        "2:9:-1:0",
        "2:9:-1:5",
        "2:10:-1:-1",
        "3:0:-1:-1",
        "10:0:-1:-1",
    ]


def test_in_window_whole_entry_end_includes_every_batch_message():
    end = message_id_key("5:20:-1:-1")
    assert in_window(5, 20, 0, end)
    assert in_window(5, 20, 999, end)
    assert in_window(5, 19, -1, end)
    assert in_window(4, 99, 3, end)
    assert not in_window(5, 21, -1, end)
    assert not in_window(6, 0, -1, end)
    assert not in_window(5, 20, 0, None)


def test_in_window_batch_index_end_cuts_inside_the_batch():
    end = message_id_key("5:20:-1:3")
    assert in_window(5, 20, 3, end)
    assert not in_window(5, 20, 4, end)


def test_normalize_and_parse_topics():
    assert normalize_topic("orders-DLQ") == "persistent://public/default/orders-DLQ"
    assert normalize_topic("acme/pay/orders") == "persistent://acme/pay/orders"
    full = "persistent://acme/pay/orders-sub-DLQ"
    assert parse_topics(f" {full}, orders-DLQ ,{full},") == [full, "persistent://public/default/orders-DLQ"]
    with pytest.raises(PulsarConfigError, match="no topics"):
        parse_topics(" , ")
    with pytest.raises(ConfigurationError, match="not a valid topic name; use persistent://tenant/namespace"):
        normalize_topic("kafka://x/y/z")
    with pytest.raises(ConfigurationError, match="not a valid topic name"):
        normalize_topic("a/b")
    with pytest.raises(PulsarConfigError, match="not a valid topic name"):  # the app's exit 2
        parse_topics("orders-DLQ, a/b")


def test_partition_index_and_parent_topic():
    assert partition_index("persistent://t/n/x-partition-12") == 12
    assert partition_index("persistent://t/n/x") is None
    w = PartitionWindow("persistent://t/n/x-partition-2", 2, "1:2:2:-1")
    assert w.parent_topic == "persistent://t/n/x"
    assert PartitionWindow("persistent://t/n/x", -1, None).parent_topic == "persistent://t/n/x"


def test_windows_json_round_trip_and_errors():
    windows = [
        PartitionWindow("persistent://t/n/a", -1, "7:99:-1:-1"),
        PartitionWindow("persistent://t/n/b-partition-0", 0, None),
    ]
    text = windows_to_json(windows)
    assert windows_from_json(text) == windows
    assert windows[0].end_key == (7, 99, -1, -1)
    assert windows[1].end_key is None
    with pytest.raises(WindowError, match="not valid JSON"):
        windows_from_json("{nope")
    with pytest.raises(WindowError, match="windows_to_json"):
        windows_from_json(json.dumps([{"topic": "persistent://t/n/a"}]))
    bad_entry = json.dumps({"format": 2, "windows": [{"topic": "persistent://t/n/a", "partition": -1}]})
    with pytest.raises(WindowError, match="exactly topic, partition, end_message_id"):
        windows_from_json(bad_entry)
    with pytest.raises(ValueError, match="invalid message id"):
        PartitionWindow("persistent://t/n/a", -1, "7:99")
    with pytest.raises(WindowError, match="full topic name"):
        PartitionWindow("a", -1, None)


class FakeClient:
    def __init__(self, partitions: dict[str, list[str]]) -> None:
        self.partitions = partitions

    def get_topic_partitions(self, topic: str) -> list[str]:
        return self.partitions.get(topic, [topic])


def test_expand_partitions_non_partitioned_and_partitioned():
    base = "persistent://t/n/x"
    client = FakeClient({base: [f"{base}-partition-1", f"{base}-partition-0"]})
    assert expand_partitions(client, "persistent://t/n/plain") == [("persistent://t/n/plain", -1)]
    assert expand_partitions(client, base) == [(f"{base}-partition-0", 0), (f"{base}-partition-1", 1)]


def test_expand_partitions_refuses_a_broker_that_cannot_address_one_partition():
    base = "persistent://t/n/x"
    p0 = f"{base}-partition-0"
    client = FakeClient({base: [p0], p0: [f"{p0}-partition-0", f"{p0}-partition-1"]})
    with pytest.raises(WindowError, match="cannot be read on its own"):
        expand_partitions(client, base)


def test_unique_consumer_names_differ():
    names = {unique_consumer_name("read") for _ in range(100)}
    assert len(names) == 100
    assert all(n.startswith("dlq-read-") for n in names)


def test_conf_options_round_trip_never_hold_the_token(monkeypatch, tmp_path):
    monkeypatch.setenv("PULSAR_AUTH_TOKEN", "secret-token-value")
    conf = PulsarConf("pulsar+ssl://broker:6651", tls_trust_certs_file="/etc/ca.pem")
    options = conf.to_options()
    assert "secret-token-value" not in json.dumps(options)
    assert PulsarConf.from_options(options) == conf
    assert conf.read_token() == "secret-token-value"
    upper = {k.upper(): v for k, v in options.items()}
    assert PulsarConf.from_options(upper) == conf

    token_file = tmp_path / "token"
    token_file.write_text("file-token\n")
    from_file = PulsarConf("pulsar://b:6650", token_file=str(token_file))
    assert from_file.read_token() == "file-token"
    assert "file-token" not in json.dumps(from_file.to_options())
    assert PulsarConf.from_options(from_file.to_options()) == from_file

    no_auth = PulsarConf.from_options({"service.url": "pulsar://b:6650", "auth.token.env": ""})
    assert no_auth.token_env is None
    assert no_auth.read_token() is None


def test_conf_errors_name_the_fix(tmp_path):
    with pytest.raises(PulsarConfigError, match="pulsar://"):
        PulsarConf("http://broker:8080")
    with pytest.raises(PulsarConfigError, match=r"'service\.url' is required"):
        PulsarConf.from_options({})
    with pytest.raises(PulsarConfigError, match="true or false"):
        PulsarConf.from_options({"service.url": "pulsar://b:6650", "tls.allow.insecure": "maybe"})
    with pytest.raises(PulsarConfigError, match="cannot read the Pulsar token file"):
        PulsarConf("pulsar://b:6650", token_file=str(tmp_path / "missing")).read_token()
    empty = tmp_path / "empty"
    empty.write_text("")
    with pytest.raises(PulsarConfigError, match="is empty"):
        PulsarConf("pulsar://b:6650", token_file=str(empty)).read_token()


def test_get_client_is_one_per_process_and_conf(monkeypatch):
    from spark_apps.dlq_replay.pulsar_io import conf as conf_mod

    conf = PulsarConf("pulsar://127.0.0.1:1", token_env=None)
    first = conf_mod.get_client(conf)
    assert conf_mod.get_client(conf) is first
    assert conf_mod.get_client(PulsarConf("pulsar://127.0.0.1:2", token_env=None)) is not first
    real_pid = conf_mod.os.getpid()
    monkeypatch.setattr(conf_mod.os, "getpid", lambda: real_pid + 100000)
    child = conf_mod.get_client(conf)
    assert child is not first  # a forked child never reuses its parent's client
    conf_mod._clients.pop((real_pid + 100000, conf)).close()


def test_task_clients_log_natively_to_stdout_or_to_the_log_file(monkeypatch, tmp_path):
    import pulsar

    from spark_apps.dlq_replay.pulsar_io import conf as conf_mod

    made: list[dict] = []

    class FakeClient:
        def __init__(self, url: str, **kwargs: object) -> None:
            made.append(kwargs)

    monkeypatch.setattr(pulsar, "Client", FakeClient)
    monkeypatch.setattr(conf_mod, "_clients", {})
    default = PulsarConf("pulsar://127.0.0.1:3", token_env=None)
    conf_mod.get_client(default)
    console = made[-1]["logger"]  # never a Python logger: its GIL would deadlock a flush (see get_client)
    assert isinstance(console, pulsar.ConsoleLogger)
    assert console.log_level == pulsar.LoggerLevel.Warn
    native = PulsarConf("pulsar://127.0.0.1:3", token_env=None, client_log_file=str(tmp_path / "c-{pid}.log"))
    assert PulsarConf.from_options(native.to_options()) == native
    conf_mod.get_client(native)
    logger = made[-1]["logger"]
    assert isinstance(logger, pulsar.FileLogger)
    assert logger.log_file == str(tmp_path / f"c-{conf_mod.os.getpid()}.log")
    assert logger.log_level == pulsar.LoggerLevel.Warn
