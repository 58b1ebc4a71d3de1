"""The operator reads ``runs/<run_id>/report.json`` from an S3 output root (moto's S3 server on loopback).

The stand-in spark-submit writes the report to ``s3a://<bucket>/dlq/runs/<run_id>/report.json`` and
prints nothing (as a driver in cluster deploy mode, whose stdout the worker never sees): the task's XCom
and asset event still carry the report. The S3 keys reach the operator only through its ``aws``
connection, never argv, logs or XCom.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest

from airflow_provider_dlq.operators.replay import DlqReplayOperator
from airflow_provider_dlq.output_storage import ReportNotFound, read_run_report

pytestmark = pytest.mark.integration

KEY_ID = "AKIAMOTOTESTKEY00001"
SECRET = "moto-secret-never-logged-0123456789"
BUCKET = "dlq-reports"
DLQ = "persistent://public/default/orders-DLQ"


@pytest.fixture(scope="module")
def s3_endpoint(s3_server):
    """The session's S3 server (moto on loopback, ``spark_standalone.s3``) with the reports bucket."""
    s3_server.bucket(BUCKET)
    return s3_server.endpoint


@pytest.fixture
def conns(monkeypatch, s3_endpoint):
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)  # the connection alone carries the keys
    pulsar = {"conn_type": "pulsar", "host": "pulsar://broker:6650"}
    aws = {
        "conn_type": "aws",
        "login": KEY_ID,
        "password": SECRET,
        "extra": {"endpoint_url": s3_endpoint, "region_name": "us-east-1"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_PULSAR_DEFAULT", json.dumps(pulsar))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    monkeypatch.setenv("AIRFLOW_CONN_DLQ_S3", json.dumps(aws))


# Writes the report to the S3 output dir with its own test keys (FAKE_S3_*), prints nothing.
SILENT_S3_SPARK_SUBMIT = """#!{python}
import json, os, sys
from urllib.parse import urlsplit
import boto3
argv = sys.argv[1:]
app = argv.index("--run-id")
opts = dict(zip(argv[app::2], argv[app + 1 :: 2]))
with open(os.environ["FAKE_LOG"], "w") as log:
    json.dump({{"argv": argv}}, log)
root = urlsplit(opts["--output-dir"])
key = root.path.strip("/") + "/runs/" + opts["--run-id"] + "/report.json"
uri = root.scheme + "://" + root.netloc + "/" + key
report = {{"run_id": opts["--run-id"], "mode": opts["--mode"], "status": "succeeded",
          "totals": {{"snapshot": 7, "republished": 7}}, "groups": [], "other_groups": {{"groups": 0}},
          "paths": {{"report_json": uri, "report_html": uri[:-4] + "html"}}}}
env = os.environ
s3 = boto3.client("s3", endpoint_url=env["FAKE_S3_ENDPOINT"], region_name="us-east-1",
                  aws_access_key_id=env["FAKE_S3_KEY"], aws_secret_access_key=env["FAKE_S3_SECRET"])
s3.put_object(Bucket=root.netloc, Key=key, Body=json.dumps(report).encode())
"""


def _stand_in(tmp_path: Path, monkeypatch, s3_endpoint: str) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "spark-submit"
    fake.write_text(SILENT_S3_SPARK_SUBMIT.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "fake.json"))
    monkeypatch.setenv("FAKE_S3_ENDPOINT", s3_endpoint)
    monkeypatch.setenv("FAKE_S3_KEY", KEY_ID)
    monkeypatch.setenv("FAKE_S3_SECRET", SECRET)
    bundle = tmp_path / "dlq_replay.zip"
    bundle.write_bytes(b"")
    return bundle


def test_report_is_read_from_the_s3_output_root_without_a_summary_line(
    conns, s3_endpoint, tmp_path, monkeypatch, caplog
):
    bundle = _stand_in(tmp_path, monkeypatch, s3_endpoint)
    op = DlqReplayOperator(
        task_id="replay",
        topics=[DLQ],
        output_dir=f"s3a://{BUCKET}/dlq",
        storage_conn_id="dlq_s3",
        bundle_path=str(bundle),
        application=str(tmp_path / "main.py"),
        class_data_archive=False,
        compiled_pyspark=False,
        quick_jit=False,
    )
    ti = SimpleNamespace(dag_id="d", task_id="replay", run_id="manual__s3", map_index=-1)
    events: defaultdict[object, SimpleNamespace] = defaultdict(lambda: SimpleNamespace(extra={}))
    with caplog.at_level(logging.DEBUG):
        summary = op.execute({"ti": ti, "outlet_events": events})
    assert op._hook is not None
    assert op._hook.summary_line is None  # stdout carried no summary
    assert summary["run_id"] == "d.replay.manual__s3"
    assert summary["totals"] == {"snapshot": 7, "republished": 7}
    assert summary["paths"]["report_json"] == f"s3a://{BUCKET}/dlq/runs/d.replay.manual__s3/report.json"
    assert events[op.outlets[0]].extra["totals"]["republished"] == 7
    assert op.outlets[0].uri == f"s3a://{BUCKET}/dlq"
    argv = json.loads((tmp_path / "fake.json").read_text())["argv"]
    assert argv[argv.index("--output-dir") + 1] == f"s3a://{BUCKET}/dlq"
    for secret in (SECRET, KEY_ID):
        assert secret not in " ".join(argv)
        assert secret not in json.dumps(summary)
        assert secret not in json.dumps(events[op.outlets[0]].extra)
        assert secret not in caplog.text


def test_a_missing_s3_report_names_where_it_looked(conns, s3_endpoint):
    location = f"s3a://{BUCKET}/dlq/runs/absent/report.json"
    with pytest.raises(ReportNotFound, match=r"no report was found at s3a://dlq-reports/dlq/runs/absent"):
        read_run_report(location, "absent", None, "dlq_s3", logging.getLogger("t"))
    summary = 'DLQ_REPLAY_SUMMARY {"run_id": "absent", "status": "succeeded"}'
    assert (
        read_run_report(location, "absent", summary, "dlq_s3", logging.getLogger("t"))["run_id"] == "absent"
    )
