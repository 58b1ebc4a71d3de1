"""The run's session pieces on a real Spark Connect server: the defaults, the shipped code and fix files,
the step's tags, the application's id, the Arrow frames and UDFs, and a lost lock's interruption.

A Connect session marks its whole process as a Connect client, so the checks run in a child Python
(the driver of ``spark-submit --remote`` is one too) and print their findings as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]

_CHILD = textwrap.dedent(
    """
    import json, os, sys, threading, time

    from spark_apps.dlq_replay.arrow_util import local_frame
    from spark_apps.dlq_replay.cli import build_session
    from spark_apps.dlq_replay.lock import RunLock
    from spark_apps.dlq_replay.playbook import load_playbook
    from spark_apps.dlq_replay.preflight import ship_and_load_fixes
    from spark_apps.dlq_replay.progress import StepProgress, step_tag
    from spark_apps.dlq_replay.report import spark_info
    from spark_apps.dlq_replay.session import default_parallelism, is_connect, ship_code

    url, playbook_path = sys.argv[1:3]
    os.environ["SPARK_REMOTE"] = url  # what spark-submit --remote sets for its driver
    spark = build_session("r1")  # the app's own session set-up: defaults applied, code shipped
    out = {"connect": is_connect(spark), "parallelism": default_parallelism(spark)}
    out["shipped"] = ship_code(spark)  # already shipped: the same path, not twice
    out["conf"] = {
        key: spark.conf.get(key, None)
        for key in (
            "spark.sql.shuffle.partitions",
            "spark.sql.execution.arrow.maxRecordsPerBatch",
            "spark.sql.session.timeZone",
        )
    }

    def where(batches):
        import pyarrow as pa
        import spark_apps.dlq_replay.session as module
        import connect_fix_module

        for batch in batches:
            yield pa.RecordBatch.from_pylist(
                [{"file": module.__file__, "fixed": connect_fix_module.shout("x")}] * batch.num_rows
            )

    ship_and_load_fixes(spark, load_playbook(playbook_path))
    progress = StepProgress(spark, interval=60)
    progress.start("decide", None)
    out["tags"] = sorted(spark.getTags())
    rows = spark.range(2, numPartitions=2).mapInArrow(where, "file string, fixed string").collect()
    out["worker_files"] = sorted({r["file"] for r in rows})
    out["fixed"] = sorted({r["fixed"] for r in rows})
    frame = local_frame(spark, [("t-0", 1), ("t-1", None)], "topic string, n long")
    out["frame"] = [list(r) for r in frame.orderBy("topic").collect()]

    def count(table):
        import pyarrow as pa

        return pa.table({"topic": [table["topic"][0].as_py()], "rows": [table.num_rows]})

    grouped = frame.groupBy("topic").applyInArrow(count, "topic string, rows long")
    out["grouped"] = sorted([r["topic"], r["rows"]] for r in grouped.collect())
    out["spark"] = spark_info(spark)

    def slow(batches):
        import time

        for batch in batches:
            time.sleep(30)
            yield batch

    stopper = threading.Timer(3.0, RunLock(None, None, spark).interrupt)
    stopper.start()
    started = time.monotonic()
    try:
        spark.range(0, 4, numPartitions=2).mapInArrow(slow, "id long").collect()
        out["interrupted"] = None
    except Exception as exc:
        out["interrupted"] = type(exc).__name__ + ": " + str(exc)[:200]
    out["interrupt_s"] = time.monotonic() - started
    stopper.cancel()
    progress.stop()
    out["tags_after"] = sorted(spark.getTags())
    out["count_after"] = spark.range(3).count()
    spark.stop()
    print("RESULT " + json.dumps(out))
    """
)


def test_the_session_pieces_work_under_spark_connect(spark_connect, tmp_path):
    fix = tmp_path / "connect_fix_module.py"
    fix.write_text("def shout(text):\n    return text.upper()\n\n\ndef fix(record):\n    return record\n")
    playbook = tmp_path / "playbook.yaml"
    playbook.write_text(
        "version: 1\nfix_files: [connect_fix_module.py]\nrules:\n"
        "  - match: {error_class: Boom}\n    action: republish\n    fix: connect_fix_module:fix\n"
        "    fix_version: 1\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
    env["TMPDIR"] = str(tmp_path)  # the source bundle the child ships lands here
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, spark_connect, str(playbook)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0, done.stderr[-3000:]
    assert lines, done.stdout[-3000:]
    out = json.loads(lines[-1][len("RESULT ") :])
    assert out["connect"] is True
    assert out["parallelism"] == 2  # the server's local[2]
    assert out["conf"] == {
        "spark.sql.shuffle.partitions": "4",  # the server's own setting wins
        "spark.sql.execution.arrow.maxRecordsPerBatch": "2000",
        "spark.sql.session.timeZone": "UTC",
    }
    assert out["shipped"].startswith(str(tmp_path))
    assert out["shipped"].endswith(".zip")
    assert any(".zip/spark_apps/" in path for path in out["worker_files"])  # imported from the shipped zip
    assert out["tags"] == ["dlq-replay:decide"]
    assert out["fixed"] == ["X"]  # the fix file reached the server's Python workers
    assert out["frame"] == [["t-0", 1], ["t-1", None]]
    assert out["grouped"] == [["t-0", 1], ["t-1", 1]]
    assert out["spark"]["application_id"]
    assert out["spark"]["master"] == "local[2]"
    assert out["interrupted"], out
    assert out["interrupt_s"] < 25, out
    assert out["tags_after"] == []
    assert out["count_after"] == 3
