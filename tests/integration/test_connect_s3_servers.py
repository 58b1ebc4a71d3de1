"""The servers of the "runs everywhere" tests work together: a Spark Connect server on loopback
(``spark_connect``) runs Python tasks that write Parquet to moto's S3 server (``s3_server``) through the
replay app's storage layer, shipped to the server as an artifact; the objects are read back with boto3.

The session here is ``pyspark.sql.connect.session.SparkSession`` itself: a Connect session opened through
``pyspark.sql.SparkSession.builder.remote`` marks the whole test process as a Connect client
(``SPARK_CONNECT_MODE_ENABLED``), and the classic ``spark`` fixture of later tests would then fail.
The server's application id is the one its readiness check read (``ConnectServer.application_id``).
"""

from __future__ import annotations

import io
import sys
import uuid

import pytest

pytestmark = pytest.mark.integration

ROWS = 1000


def test_connect_tasks_write_parquet_to_s3_through_the_apps_storage(
    spark_connect, spark_connect_server, s3_server, tmp_path, monkeypatch
):
    import pyarrow.parquet as pq
    from pyspark.sql.connect.session import SparkSession

    from airflow_provider_dlq.bundle import build_bundle

    bucket = s3_server.bucket("connect-infra")
    prefix = f"parts-{uuid.uuid4().hex[:8]}"
    root = f"s3://{bucket}/{prefix}"
    zip_path = build_bundle(tmp_path / "bundle").zip_path  # spark_apps/** as --py-files would carry it

    def write_parts(batches):  # runs in the server's Python workers (pickled by value: a closure)
        import os
        import sys

        import pyarrow as pa
        import pyarrow.parquet as pq

        from spark_apps.dlq_replay.storage import filesystem

        table = pa.Table.from_batches(list(batches))
        if table.num_rows == 0:
            return
        first = min(table.column("id").to_pylist())
        fs, path = filesystem(f"{root}/part-{first:05d}.parquet")
        pq.write_table(table, path, filesystem=fs)
        yield pa.RecordBatch.from_pylist(
            [
                {
                    "path": path,
                    "rows": table.num_rows,
                    "endpoint": os.environ.get("AWS_ENDPOINT_URL_S3", ""),
                    "python": sys.executable,
                }
            ]
        )

    # addArtifacts(zip, pyfile=True) also puts the zip on this process's sys.path (pyspark's Connect
    # client does, for the driver's own imports): on a copy, so the later tests import the source tree.
    monkeypatch.setattr(sys, "path", list(sys.path))
    session = SparkSession.builder.remote(spark_connect).getOrCreate()
    try:
        session.addArtifacts(str(zip_path), pyfile=True)
        written = (
            session.range(0, ROWS, 1, 4)
            .mapInArrow(write_parts, "path string, rows long, endpoint string, python string")
            .collect()
        )
        app_id = session.conf.get("spark.app.id")
    finally:
        session.stop()
    assert sum(r["rows"] for r in written) == ROWS, (written, spark_connect_server.tail())
    assert len(written) == 4
    assert app_id == spark_connect_server.application_id
    assert {r["endpoint"] for r in written} == {s3_server.endpoint}  # the server's env reached its tasks
    assert {r["python"] for r in written} == {sys.executable}  # spark.pyspark.python: the venv's python
    keys = s3_server.keys(bucket, prefix + "/")
    assert keys == sorted(r["path"].split("/", 1)[1] for r in written)
    client = s3_server.client()
    ids: list[int] = []
    for key in keys:
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        ids += pq.read_table(io.BytesIO(body)).column("id").to_pylist()
    assert sorted(ids) == list(range(ROWS))
