"""The run's Spark session through the public ``SparkSession`` API only (``local[n]``, a cluster, Spark
Connect): its default parallelism, and the app's code and fix files shipped to a Connect server."""

from __future__ import annotations

import hashlib
import importlib
import io
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
import weakref
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import spark_apps
from spark_apps.dlq_replay.storage import write_bytes

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("spark_apps.dlq_replay")

_LOCAL = re.compile(r"local(?:\[(\d+|\*)(?:,\s*\d+)?\])?")
#: Fixed timestamp of the source bundle's entries: the same sources give the same zip (and name).
_ZIP_DATE = (2020, 1, 1, 0, 0, 0)

_lock = threading.Lock()
_shipped: weakref.WeakKeyDictionary[SparkSession, set[str]] = weakref.WeakKeyDictionary()
_import_dir: list[str] = []


def is_connect(spark: SparkSession) -> bool:
    """True when ``spark`` is a Spark Connect session (told by its class, without importing Connect)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def conf_value(spark: SparkSession, key: str) -> str | None:
    """The session's explicitly set value of ``key`` (``None`` when unset or unreadable)."""
    try:
        value = spark.conf.get(key, None)
    except Exception:  # a key the server will not show
        return None
    return (str(value).strip() or None) if value is not None else None


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def master_parallelism(master: str | None, cores: int | None) -> int | None:
    """The default parallelism a ``local[n|*]`` master implies, else ``None`` (asked of Spark)."""
    if (match := _LOCAL.fullmatch((master or "").strip())) is None:
        return None
    threads = match.group(1) or "1"
    return cores if threads == "*" else max(1, int(threads))


def _range_partitions(spark: SparkSession) -> int:
    """The partitions Spark gives a ``range`` without a partition count: its default parallelism."""
    from pyspark.sql import functions as F

    ids = spark.range(0, 1 << 20).select(F.spark_partition_id().alias("p"))  # not inside an aggregate
    return int(ids.agg(F.max("p")).collect()[0][0]) + 1


def default_parallelism(spark: SparkSession) -> int:
    """``spark.default.parallelism``, else a ``local`` master's, else a ``range``'s (asked at each call)."""
    given = conf_value(spark, "spark.default.parallelism")
    if given and given.isdigit() and int(given) > 0:
        return int(given)
    # Under Spark Connect local[*] names the server's cores, not this machine's.
    cores = None if is_connect(spark) else _cores()
    return master_parallelism(conf_value(spark, "spark.master"), cores) or _range_partitions(spark)


def loaded_from_zip() -> str | None:
    """The zip the app was imported from (``--py-files``), or ``None`` (a source checkout)."""
    path = Path(os.path.abspath(str(spark_apps.__file__)))
    return next((str(p) for p in [path, *path.parents] if p.is_file() and zipfile.is_zipfile(p)), None)


def source_bundle(directory: str | None = None) -> str:
    """A zip of the app and the vendored library from a source checkout, named by its content."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for package in ("spark_apps", "pulsar_dlq_consumer"):  # the app and the vendored library
            base = Path(os.path.abspath(str(importlib.import_module(package).__file__))).parent
            for path in sorted(base.rglob("*.py")):  # no __pycache__ entry: those end in .pyc
                rel = path.relative_to(base.parent).as_posix()
                archive.writestr(zipfile.ZipInfo(rel, _ZIP_DATE), path.read_bytes(), zipfile.ZIP_DEFLATED)
    data = buffer.getvalue()
    digest = hashlib.sha256(data).hexdigest()[:16]
    target = os.path.join(directory or tempfile.gettempdir(), f"dlq_replay_code-{digest}.zip")
    if not os.path.isfile(target):
        write_bytes(target, data)
    return target


def _ship_once(spark: SparkSession, path: str) -> bool:
    key = os.path.abspath(path)
    with _lock:
        done = _shipped.setdefault(spark, set())
        if key in done:
            return False
        spark.addArtifacts(path, pyfile=True)
        done.add(key)
    return True


def ship_code(spark: SparkSession) -> str | None:
    """Under Spark Connect, ship the app's code to the server's Python workers; what was shipped."""
    if not is_connect(spark):
        return None
    path = loaded_from_zip() or source_bundle()
    if _ship_once(spark, path):
        log.info(
            "Spark Connect: the app's code (%s) added to the session's Python files", os.path.basename(path)
        )
    return path


def add_pyfile(spark: SparkSession, path: str) -> None:
    """Ship the Python file ``path`` to the session's Python workers and make it importable here too."""
    _ship_once(spark, path)
    if not is_connect(spark):
        return
    with _lock:
        if not _import_dir:
            _import_dir.append(tempfile.mkdtemp(prefix="dlq-replay-pyfiles-"))
            sys.path.insert(1, _import_dir[0])
        target = os.path.join(_import_dir[0], os.path.basename(path))
        shutil.copyfile(path, target)
        if target.endswith((".zip", ".egg")) and target not in sys.path:
            sys.path.insert(1, target)
    importlib.invalidate_caches()


def remove_local_copies() -> None:
    """Delete the folder :func:`add_pyfile` copied files to (imported modules stay usable)."""
    with _lock:
        folders, _import_dir[:] = list(_import_dir), []
        for folder in folders:
            sys.path[:] = [p for p in sys.path if p != folder and not p.startswith(folder + os.sep)]
            shutil.rmtree(folder, ignore_errors=True)
