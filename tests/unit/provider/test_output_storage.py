"""The output-root reader: local files, the S3 options from an ``aws`` connection or the environment,
Hadoop's ``s3a://`` mapped to S3, and errors that name the fix."""

from __future__ import annotations

import json

import pytest

from airflow_provider_dlq.output_storage import (
    OutputTooLarge,
    OutputUnsupported,
    arrow_filesystem,
    read_bytes,
    s3_options,
    split_location,
)


def test_local_paths_and_file_uris_read_from_disk(tmp_path):
    report = tmp_path / "runs" / "r1" / "report.json"
    report.parent.mkdir(parents=True)
    report.write_text('{"run_id": "r1"}')
    assert split_location(str(report)) == ("", str(report))
    assert split_location(report.as_uri()) == ("", str(report))
    assert read_bytes(report.as_uri()) == b'{"run_id": "r1"}'
    with pytest.raises(FileNotFoundError):
        read_bytes(str(tmp_path / "absent.json"))
    with pytest.raises(OutputTooLarge, match="more than the limit of 4"):
        read_bytes(str(report), max_bytes=4)


def test_an_aws_connection_gives_keys_endpoint_and_region(monkeypatch):
    conn = {
        "conn_type": "aws",
        "login": "AKIA1",
        "password": "s3cr3t",
        "extra": {
            "endpoint_url": "http://127.0.0.1:9000",
            "region_name": "eu-west-1",
            "aws_session_token": "t",
        },
    }
    monkeypatch.setenv("AIRFLOW_CONN_DLQ_S3", json.dumps(conn))
    assert s3_options("dlq_s3", {}) == {
        "access_key": "AKIA1",
        "secret_key": "s3cr3t",
        "session_token": "t",
        "endpoint_override": "http://127.0.0.1:9000",
        "region": "eu-west-1",
    }
    conn["extra"] = {"service_config": {"s3": {"endpoint_url": "http://minio:9000"}}}
    monkeypatch.setenv("AIRFLOW_CONN_DLQ_S3", json.dumps(conn))
    assert s3_options("dlq_s3", {})["endpoint_override"] == "http://minio:9000"


def test_without_a_connection_the_standard_aws_environment_is_used():
    env = {"AWS_ENDPOINT_URL": "http://a:1", "AWS_ENDPOINT_URL_S3": "http://s3:2", "AWS_DEFAULT_REGION": "r"}
    # keys are left to pyarrow's own chain (environment, shared config, instance profile)
    assert s3_options(None, env) == {"endpoint_override": "http://s3:2", "region": "r"}
    assert s3_options(None, {}) == {}


@pytest.mark.parametrize("scheme", ["s3", "s3a", "s3n"])
def test_hadoop_s3_schemes_open_as_s3(monkeypatch, scheme):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    filesystem, path = arrow_filesystem(scheme, f"{scheme}://bucket/dlq/runs/r/report.json", None)
    assert filesystem.type_name == "s3"
    assert path == "bucket/dlq/runs/r/report.json"


def test_an_unknown_scheme_names_the_fix():
    with pytest.raises(OutputUnsupported, match=r"cannot read wasb:// here.*install the Airflow provider"):
        read_bytes("wasb://c@a/dlq/runs/r/report.json")
