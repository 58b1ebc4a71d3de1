"""spark-submit runs pyspark's own files, whatever else installed into ``pyspark/``.

Spark provider 6.x depends on ``pyspark-client``, which installs about a hundred older Python files into
the same ``pyspark/`` folder as ``pyspark`` (whichever distribution the installer writes last wins, and
pip writes ``pyspark-client`` last). spark-submit does not import those: its driver and its Python workers
import PySpark from ``pyspark/python/lib/pyspark.zip`` and py4j's zip, which only ``pyspark`` ships, next
to the jars and the launch scripts. This test checks exactly that in the running venv: those files are as
pyspark's RECORD says, ``spark-submit --version`` names the jars' version, and a submitted script's driver
and executor import a PySpark of that version from ``pyspark.zip``. ``scripts/test-bounds.sh`` runs it at
both ends of the version range, the newest one with ``pyspark-client`` written last.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

#: Folders of the pyspark distribution that spark-submit reads (the launch scripts, the JVM side, the
#: Python the driver and workers import).
SPARK_SUBMIT_PARTS = ("pyspark/bin/", "pyspark/sbin/", "pyspark/jars/", "pyspark/python/lib/")

PROBE = """
import json, pyspark
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[1]").appName("pyspark-files").getOrCreate()
def seen(_):
    import pyspark
    return [pyspark.__version__, pyspark.__file__]
print("PROBE " + json.dumps({
    "driver": [pyspark.__version__, pyspark.__file__],
    "executor": spark.sparkContext.parallelize([0], 1).map(seen).first(),
}))
spark.stop()
"""


def _pyspark() -> tuple[md.Distribution, Path, str]:
    dist = md.distribution("pyspark")
    home = Path(str(dist.locate_file("pyspark")))
    jars = sorted(home.glob("jars/spark-core_*.jar"))
    assert jars, f"no spark-core jar under {home / 'jars'}"
    return dist, home, jars[0].stem.rsplit("-", 1)[1]


def _spark_submit() -> Path:
    found = Path(sys.executable).parent / "spark-submit"
    assert found.is_file(), f"{found}: pyspark's spark-submit script is not in this venv's bin/"
    return found


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", "PYTHONPATH")}
    env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return env


def test_the_files_spark_submit_reads_are_pyspark_s_own(record_figure):
    dist, _home, jar_version = _pyspark()
    assert dist.version == jar_version, (dist.version, jar_version)
    checked, bad = 0, []
    for f in dist.files or []:
        path = str(f)
        if f.hash is None or not (path.startswith(SPARK_SUBMIT_PARTS) or path.endswith("/bin/spark-submit")):
            continue
        data = Path(str(f.locate())).read_bytes()
        digest = base64.urlsafe_b64encode(hashlib.new(f.hash.mode, data).digest()).rstrip(b"=").decode()
        checked += 1
        if digest != f.hash.value:
            bad.append(path)
    assert checked > 200, checked
    assert bad == [], bad[:20]
    sharing = sorted(
        f"{d.metadata['Name']} {d.version}"
        for d in md.distributions()
        if d.metadata["Name"].lower() != "pyspark"
        and any(str(p).startswith("pyspark/") for p in d.files or [])
    )
    import pyspark

    record_figure(
        f"pyspark {jar_version}: {checked} files spark-submit reads match its RECORD; also writing "
        f"pyspark/: {', '.join(sharing) or 'nothing'}; `import pyspark` here gives {pyspark.__version__}"
    )


def test_spark_submit_runs_the_pyspark_of_its_jars(tmp_path):
    _dist, home, jar_version = _pyspark()
    spark_submit = _spark_submit()
    version = subprocess.run(
        [str(spark_submit), "--version"], capture_output=True, text=True, timeout=180, env=_env(), check=False
    )
    assert version.returncode == 0, version.stdout[-3000:] + version.stderr[-3000:]
    assert re.search(rf"version {re.escape(jar_version)}\b", version.stdout + version.stderr)

    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    run = subprocess.run(
        [str(spark_submit), "--conf", "spark.log.level=WARN", "--conf", "spark.ui.enabled=false", str(probe)],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
        cwd=tmp_path,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (line,) = [x for x in run.stdout.splitlines() if x.startswith("PROBE ")]
    seen = json.loads(line.removeprefix("PROBE "))
    zip_path = str(home / "python" / "lib" / "pyspark.zip")
    for side in ("driver", "executor"):
        version_seen, file_seen = seen[side]
        assert version_seen == jar_version, seen
        assert file_seen.startswith(zip_path), seen
