"""A compiled copy of spark-submit's PySpark zips: a local replay starts faster (``docs/operator.md``)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_provider_dlq.class_data import cache_entry, cache_root, files_key, spark_home
from airflow_provider_dlq.driver_footprint import local_cores
from airflow_provider_dlq.resources import spark_app_dir

if TYPE_CHECKING:
    from collections.abc import Mapping

log = logging.getLogger(__name__)

DAEMON_MODULE_CONF = "spark.python.daemon.module"
PYTHON_CONF = "spark.pyspark.python"
WORKERS_PYTHONPATH_CONF = "spark.executorEnv.PYTHONPATH"
#: As in ``spark_apps/pyspark_imports.py`` (data in the wheel, not imported; a test checks they agree).
MARKER = "dlq-compiled-pyspark.json"
DAEMON_MODULE = "dlq_pyspark_daemon"
FOLDER_ENV = "DLQ_COMPILED_PYSPARK"
_PREFIX = "pyspark-"
_COMPILE_TIMEOUT_S = 600.0
#: PySpark's own tests are never imported by a run: not compiled (they are a third of the zip).
_SKIP_COMPILE = r"[/\\]tests[/\\]"


def spark_python_zips(env: Mapping[str, str] | None = None) -> list[Path]:
    """spark-submit's ``pyspark.zip`` and ``py4j-*-src.zip`` (empty when either is missing)."""
    home = spark_home(env)
    if home is None:
        return []
    lib = home / "python" / "lib"
    pyspark = lib / "pyspark.zip"
    py4j = sorted(lib.glob("py4j-*-src.zip"))
    return [pyspark, py4j[-1]] if pyspark.is_file() and py4j else []


@dataclass(frozen=True)
class CompiledCopy:
    """A ready compiled copy: what a run adds to spark-submit's environment and settings."""

    folder: Path

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` naming the folder to the driver."""
        return {**env, FOLDER_ENV: str(self.folder)}

    def conf(self, conf: Mapping[str, str]) -> dict[str, str]:
        """``conf`` with the folder first on the workers' path and its daemon as theirs."""
        merged = {DAEMON_MODULE_CONF: DAEMON_MODULE, **{str(k): str(v) for k, v in conf.items()}}
        current = merged.get(WORKERS_PYTHONPATH_CONF, "")
        merged[WORKERS_PYTHONPATH_CONF] = os.pathsep.join(p for p in (str(self.folder), current) if p)
        return merged


class CompiledPySpark:
    """The compiled PySpark copies of one cache ``directory``."""

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self.directory = Path(directory) if directory else cache_root() / "compiled-pyspark"

    def prepare(self, master: str, env: Mapping[str, str], conf: Mapping[str, str]) -> CompiledCopy | None:
        """The compiled copy for a local run, made now when missing; ``None`` for a cluster master, a daemon
        the user chose, or when the zips, the Python or the folder are not usable."""
        if local_cores(master) is None or DAEMON_MODULE_CONF in conf:
            return None
        environ = {**os.environ, **env}
        zips = spark_python_zips(environ)
        # The workers' Python as Spark chooses it: PYSPARK_PYTHON, the setting, else python3.
        chosen = environ.get("PYSPARK_PYTHON") or conf.get(PYTHON_CONF) or "python3"
        python = shutil.which(chosen, path=environ.get("PATH"))
        if not zips or python is None:
            log.info(
                "No PySpark zips or worker Python found; the run imports PySpark from spark-submit's zips"
            )
            return None
        try:
            key = files_key(Path(python), *zips)
            folder, making = cache_entry(self.directory, _PREFIX, key)
            if not (folder / MARKER).is_file():
                self._make(folder, making, python, zips)
            os.utime(folder)  # in use: kept by cache_entry
        except (OSError, subprocess.SubprocessError, zipfile.BadZipFile) as exc:
            log.info(
                "Compiled PySpark not made in %s (%s: %s); the run imports PySpark from spark-submit's zips",
                self.directory,
                type(exc).__name__,
                exc,
            )
            return None
        return CompiledCopy(folder)

    def _make(self, folder: Path, making: Path, python: str, zips: list[Path]) -> None:
        """Extract and compile ``zips`` into ``making``, then rename it ``folder`` (marker last)."""
        started = time.monotonic()
        try:
            for path in zips:
                shutil.unpack_archive(path, making)
            shutil.copyfile(spark_app_dir() / "pyspark_imports.py", making / f"{DAEMON_MODULE}.py")
            subprocess.run(
                [python, "-m", "compileall", "-q", "-j", "0", "-x", _SKIP_COMPILE, str(making)],
                check=True,
                capture_output=True,
                timeout=_COMPILE_TIMEOUT_S,
            )
            made_from = {z.name: {"size": z.stat().st_size, "mtime_ns": z.stat().st_mtime_ns} for z in zips}
            (making / MARKER).write_text(json.dumps({"zips": made_from}, indent=2), encoding="utf-8")
            try:
                making.rename(folder)
            except OSError:
                if not (folder / MARKER).is_file():
                    raise
        finally:
            shutil.rmtree(making, ignore_errors=True)
        log.info(
            "Compiled PySpark made in %.1f s: %s (later runs start faster)",
            time.monotonic() - started,
            folder,
        )
