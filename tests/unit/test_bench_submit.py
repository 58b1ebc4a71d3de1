"""How the benchmark submits the replay app and where it reads its outputs (pure, or local files only)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.output_root import OutputRoot, local_root, s3_filesystem


def _command(master: str, output_dir: str = "/data/out") -> list[str]:
    from bench.ours import build_command

    return build_command(
        service_url="pulsar://127.0.0.1:6650",
        admin_url="http://127.0.0.1:8080",
        run_id="bench-400",
        zip_path=Path("/b/dlq_replay.zip"),
        main_path=Path("/b/dlq_replay_main.py"),
        playbook=Path("/b/playbook.yaml"),
        output_dir=output_dir,
        master=master,
        spark_conf=["spark.driver.memory=512m"],
        app_args=[],
    )


def test_a_connect_url_is_submitted_with_remote_and_the_connect_api_mode():
    cmd = _command("sc://127.0.0.1:15002", "s3://dlq-bench/apache-400-ours_connect")
    assert "--master" not in cmd
    at = cmd.index("--remote")
    assert cmd[at : at + 4] == ["--remote", "sc://127.0.0.1:15002", "--conf", "spark.api.mode=connect"]
    assert cmd[cmd.index("--output-dir") + 1] == "s3://dlq-bench/apache-400-ours_connect"
    assert not any("AWS" in part or "moto" in part for part in cmd)  # keys travel in the environment


def test_a_master_is_submitted_with_master():
    cmd = _command("local[2]")
    assert cmd[cmd.index("--master") + 1] == "local[2]"
    assert "--remote" not in cmd
    assert "spark.api.mode=connect" not in cmd


def test_the_connect_server_gets_the_operators_local2_driver_settings(tmp_path):
    from airflow_provider_dlq.driver_footprint import lean_driver_conf
    from bench.masters import connect_server_conf

    conf, env = connect_server_conf(tmp_path)
    local2 = lean_driver_conf({}, "local[2]")
    assert conf["spark.driver.memory"] == local2["spark.driver.memory"]
    options = conf["spark.driver.extraJavaOptions"]
    assert f"-Djava.io.tmpdir={tmp_path / 'connect-jvm-tmp'}" in options
    assert "-XX:+UseSerialGC" in options
    assert (tmp_path / "connect-jvm-tmp").is_dir()
    assert set(env) <= {"MALLOC_ARENA_MAX"}


def test_every_contender_of_this_project_has_a_spark_target():
    from bench.masters import TARGETS
    from bench.results_model import OURS

    assert set(TARGETS) == set(OURS)


def test_a_local_output_root_reads_the_report_and_counts_a_runs_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = local_root(tmp_path)
    assert root.uri == str(tmp_path / "out")
    assert root.env == {}
    report = Path(root.uri, "runs", "r1", "report.json")
    report.parent.mkdir(parents=True)
    report.write_text('{"status": "succeeded"}')
    assert root.read_bytes(str(report)) == b'{"status": "succeeded"}'
    assert root.read_bytes(f"file://{report}") == b'{"status": "succeeded"}'
    assert root.read_bytes(str(report.parent / "missing.json")) is None
    ledger = Path(root.uri, "ledger")
    for run_id, rows in (("r1", 3), ("r0", 2)):
        part = ledger / f"run_id={run_id}"
        part.mkdir(parents=True)
        pq.write_table(pa.table({"message_id": list(range(rows))}), part / "part-0.parquet")
    assert root.count_parquet_rows(str(ledger), run_id="r1") == 3
    assert root.count_parquet_rows(str(ledger)) == 5
    assert root.count_parquet_rows(str(tmp_path / "out" / "archive")) == 0


def test_an_s3_output_root_opens_s3_uris_with_the_servers_settings():
    env = {
        "AWS_ACCESS_KEY_ID": "AKIAMOTOTESTKEY00001",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9",
    }
    root = OutputRoot("s3", "s3://dlq-bench/apache-400-ours", env)
    for scheme in ("s3", "s3a"):
        fs, inner = root.filesystem(f"{scheme}://dlq-bench/apache-400-ours/runs/r1/report.json")
        assert fs.type_name == "s3"
        assert inner == "dlq-bench/apache-400-ours/runs/r1/report.json"
    assert s3_filesystem(env).region == "us-east-1"
    assert "secret" not in repr(root)
    with pytest.raises(ValueError, match="local paths and s3:// URIs only"):
        root.filesystem("gs://bucket/x")
