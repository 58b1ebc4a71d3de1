"""The bundled app runs under spark-submit on a Python that has pyspark and pulsar-client but no Airflow.

The Python is a fresh ``uv`` virtualenv with only ``pyspark``, ``pulsar-client``, ``pyarrow`` and ``pandas``
(PySpark's Arrow UDFs need it on the driver) (from the
warm uv cache this takes about a second). When uv cannot build it (no uv, no cache and no network), the
project's Python is used with a ``sitecustomize`` that blocks every ``airflow`` import and ``PYTHONPATH``
pointing at the bundle first; both the driver and the Spark workers check that ``import airflow`` fails.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from pulsar_io_helpers import drain, produce

from airflow_provider_dlq.bundle import build_bundle

pytestmark = pytest.mark.integration
log = logging.getLogger(__name__)

_BLOCKER = '''
import sys


class _NoAirflow:
    """Stands in for an environment without Airflow."""

    def find_spec(self, name, path=None, target=None):
        if name == "airflow" or name.startswith("airflow."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None


sys.meta_path.insert(0, _NoAirflow())
'''

_APP = """
import json
import os
import sys
from functools import partial


def airflow_importable():
    try:
        import airflow  # noqa: F401
    except ImportError:
        return False
    return True


def worker_check(batches):
    import pyarrow as pa
    import spark_apps

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pylist([{"airflow": airflow_importable(), "where": spark_apps.__file__}])


def main():
    url, dlq, target = sys.argv[1:4]
    assert not airflow_importable(), "airflow must not be importable"
    import spark_apps
    from pulsar_dlq_consumer.context import parse_error_context
    from pyspark.sql import SparkSession

    from spark_apps.dlq_replay.pulsar_io.commit import (
        COMMIT_INPUT_SCHEMA, COMMIT_RESULT_SCHEMA, make_commit_fn,
    )
    from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf
    from spark_apps.dlq_replay.pulsar_io.republish import (
        REPUBLISH_INPUT_SCHEMA, REPUBLISH_RESULT_SCHEMA, republish_batches,
    )
    from spark_apps.dlq_replay.pulsar_io.source import register
    from spark_apps.dlq_replay.pulsar_io.window import freeze, windows_to_json

    spark = SparkSession.builder.appName("bundle-check").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    workers = spark.range(2, numPartitions=2).mapInArrow(worker_check, "airflow boolean, where string")
    workers = [r.asDict() for r in workers.collect()]
    conf = PulsarConf(url)
    windows = freeze(conf, dlq, "bundle-sub").windows
    register(spark)
    df = spark.read.format("pulsar").options(
        **conf.to_options(), subscription="bundle-sub", window=windows_to_json(windows)
    ).load()
    rows = df.collect()
    formats = sorted({
        parse_error_context(
            dict(r.properties), dlq_topic=r.topic, dlq_message_id=r.message_id_str,
            redelivery_count=r.redelivery_count,
        ).context_format
        for r in rows
    })
    to_send = spark.createDataFrame(
        [(f"r{i}", target, "bundle-producer", i, bytes(r.value), r.key, None, None, {"REPLAY_ID": f"r{i}"}, i)
         for i, r in enumerate(rows)],
        REPUBLISH_INPUT_SCHEMA,
    ).coalesce(1).sortWithinPartitions("producer_name", "sequence_id")
    sent = to_send.mapInArrow(partial(republish_batches, conf=conf), REPUBLISH_RESULT_SCHEMA).collect()
    final = spark.createDataFrame([(r.topic, r.message_id_str) for r in rows], COMMIT_INPUT_SCHEMA)
    commit = make_commit_fn(conf, windows, "bundle-sub", 1000)
    committed = final.groupBy("dlq_topic").applyInArrow(commit, COMMIT_RESULT_SCHEMA).collect()
    print("BUNDLE_RESULT " + json.dumps({
        "driver_spark_apps": spark_apps.__file__,
        "workers": workers,
        "read": len(rows),
        "formats": formats,
        "published": sum(1 for r in sent if r.published),
        "acked": sum(r.acked for r in committed),
    }))
    spark.stop()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    # pulsar-client may abort during interpreter shutdown (apache/pulsar-client-python#256): exit now.
    os._exit(0)
"""


def _uv_python(dest: Path) -> Path | None:
    """A fresh virtualenv with the Spark Python's packages only (pyspark, pulsar-client, pyarrow, pandas,
    pyyaml); ``None`` when uv cannot make it."""
    import pandas
    import pyarrow
    import pyspark
    import yaml

    uv = shutil.which("uv")
    if uv is None:
        return None
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    python = dest / "bin" / "python"
    pins = [
        f"pyspark=={pyspark.__version__}",
        "pulsar-client==3.13.0",
        f"pyarrow=={pyarrow.__version__}",
        f"pandas=={pandas.__version__}",
        f"pyyaml=={yaml.__version__}",  # the Spark Python's documented packages (docs/replay-app.md)
    ]
    started = time.monotonic()
    try:
        subprocess.run(
            [uv, "venv", "-q", "--python", sys.executable, str(dest)], env=env, check=True, timeout=120
        )
        env["VIRTUAL_ENV"] = str(dest)
        for extra in (["--offline"], []):  # the warm cache first, the index only if needed
            done = subprocess.run(
                [uv, "pip", "install", "-q", *extra, *pins],
                env=env,
                timeout=300,
                capture_output=True,
                text=True,
            )
            if done.returncode == 0:
                break
        else:
            log.warning("uv could not install %s: %s", pins, done.stderr[-500:])
            return None
    except (subprocess.SubprocessError, OSError) as exc:
        log.warning("uv could not create the no-Airflow venv: %s", exc)
        return None
    log.warning("no-Airflow venv built with uv in %.1fs", time.monotonic() - started)
    return python


@pytest.fixture(scope="module")
def no_airflow_python(tmp_path_factory) -> tuple[Path, dict[str, str], str]:
    """(python, extra environment, mode) of a Python where ``import airflow`` fails."""
    base = tmp_path_factory.mktemp("no-airflow")
    python = _uv_python(base / "venv")
    if python is not None:
        check = subprocess.run([str(python), "-c", "import airflow"], capture_output=True, timeout=60)
        assert check.returncode != 0, "the fresh venv must not contain Airflow"
        return python, {}, "uv-venv"
    blocker = base / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(_BLOCKER)
    return Path(sys.executable), {"BLOCKER_DIR": str(blocker)}, "blocked-project-venv"


def _spark_env(python: Path, extra: dict[str, str], zip_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PYTHONPATH", "VIRTUAL_ENV"))}
    env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = str(python)
    env["SPARK_HOME"] = subprocess.run(
        [str(python), "-c", "import os, pyspark; print(os.path.dirname(pyspark.__file__))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    if "BLOCKER_DIR" in extra:
        env["PYTHONPATH"] = os.pathsep.join([extra["BLOCKER_DIR"], str(zip_path)])
    return env


def _spark_submit(python: Path, env: dict[str, str], zip_path: Path, main: Path, *args: str) -> str:
    spark_submit = Path(env["SPARK_HOME"]) / "bin" / "spark-submit"
    jvm_tmp = main.parent / "jvm-tmp"
    jvm_tmp.mkdir(exist_ok=True)
    cmd = [
        str(spark_submit),
        "--master",
        "local[2]",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.sql.shuffle.partitions=2",
        # Spark's local dirs and the unpacked native codecs stay in the test's temp dir.
        "--conf",
        f"spark.driver.extraJavaOptions=-Djava.io.tmpdir={jvm_tmp}",
        "--py-files",
        str(zip_path),
        str(main),
        *args,
    ]
    # Run outside the checkout: Python workers put their working directory on sys.path, and the
    # repository's own spark_apps/ would shadow the bundle.
    done = subprocess.run(cmd, env=env, cwd=main.parent, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:] + "\nSTDOUT:" + done.stdout[-3000:]
    return done.stdout


def test_bundled_pulsar_io_runs_without_airflow(
    no_airflow_python, tmp_path, pulsar_broker, pulsar_client, topic_factory
):
    python, extra, mode = no_airflow_python
    log.warning("no-Airflow Python: %s (%s)", python, mode)
    paths = build_bundle(tmp_path / "bundle")
    dlq, target = topic_factory("bundle-DLQ"), topic_factory("bundle-orders")
    drain(pulsar_client, dlq, "bundle-sub", timeout_ms=10)
    drain(pulsar_client, target, "check", timeout_ms=10)
    produce(pulsar_client, dlq, 30, batched=False)
    app = tmp_path / "bundle_check.py"
    app.write_text(textwrap.dedent(_APP))
    env = _spark_env(python, extra, paths.zip_path)
    out = _spark_submit(python, env, paths.zip_path, app, pulsar_broker.service_url, dlq, target)
    line = [x for x in out.splitlines() if x.startswith("BUNDLE_RESULT ")][-1]
    result = json.loads(line.split(" ", 1)[1])
    assert ".zip" in result["driver_spark_apps"]
    assert result["workers"] == [{"airflow": False, "where": result["workers"][0]["where"]}] * 2
    assert ".zip" in result["workers"][0]["where"]
    assert result["read"] == 30
    assert result["formats"] == ["pulsar_dlq_policy"]  # the vendored parser ran on the driver
    assert result["published"] == 30
    assert result["acked"] == 30
    assert len(drain(pulsar_client, target, "check")) == 30
    assert drain(pulsar_client, dlq, "bundle-sub") == []


def test_bundled_main_help_runs_without_airflow(no_airflow_python, tmp_path):
    python, extra, _ = no_airflow_python
    paths = build_bundle(tmp_path / "bundle")
    env = _spark_env(python, extra, paths.zip_path)
    out = _spark_submit(python, env, paths.zip_path, paths.main_path, "--help")
    for option in ("--run-id", "--mode", "--service-url", "--topics", "--output-dir"):
        assert option in out


def test_fallback_blocker_hides_airflow_and_serves_the_bundle(tmp_path):
    """The fallback used when uv cannot build a venv really removes Airflow and loads from the zip."""
    paths = build_bundle(tmp_path / "bundle")
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(_BLOCKER)
    env = _spark_env(Path(sys.executable), {"BLOCKER_DIR": str(blocker)}, paths.zip_path)
    code = (
        "import importlib.util, spark_apps.dlq_replay.pulsar_io.source as s\n"
        "try:\n    import airflow\nexcept ModuleNotFoundError:\n    print('blocked', s.__file__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("blocked ")
    assert "dlq_replay.zip" in out.stdout
