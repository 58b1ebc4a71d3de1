"""A managed JVM class-data archive (AppCDS) for a faster Spark driver start (``docs/operator.md``)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_provider_dlq.resources import installed_package_dir

if TYPE_CHECKING:
    from collections.abc import Mapping

log = logging.getLogger(__name__)

DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
#: JVM options that show the user manages class data sharing already (then nothing is added).
_USER_CDS_OPTIONS = ("SharedArchiveFile", "ArchiveClassesAtExit", "-Xshare", "AutoCreateSharedArchive")
_PREFIX = "dlq-replay-driver-"
#: A temporary archive older than this was left by a killed run: removed.
STALE_TEMP_S = 2 * 3600
#: An archive of another key (an older JVM or Spark) unused this long is removed.
UNUSED_ARCHIVE_S = 14 * 86400
_CHECK_TIMEOUT_S = 60.0


def with_driver_java_option(conf: Mapping[str, str], option: str, unless: tuple[str, ...]) -> dict[str, str]:
    """``conf`` with ``option`` after the driver's JVM options, unless those hold an ``unless`` marker."""
    merged = {str(k): str(v) for k, v in conf.items()}
    current = merged.get(DRIVER_JAVA_OPTIONS, "").strip()
    if not any(marker in current for marker in unless):
        merged[DRIVER_JAVA_OPTIONS] = f"{current} {option}".strip()
    return merged


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/airflow-provider-dlq`` (``~/.cache`` when unset): the provider's caches."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "airflow-provider-dlq"


def java_binary(env: Mapping[str, str] | None = None) -> str | None:
    """The ``java`` spark-submit starts: ``$JAVA_HOME/bin/java``, else ``java`` on ``PATH``."""
    environ = os.environ if env is None else env
    if home := environ.get("JAVA_HOME"):
        candidate = Path(home) / "bin" / "java"
        return str(candidate) if candidate.is_file() else None
    return shutil.which("java", path=environ.get("PATH"))


def spark_home(env: Mapping[str, str] | None = None) -> Path | None:
    """``$SPARK_HOME``, else the installed PySpark's folder (as PySpark's own ``spark-submit`` finds it)."""
    if home := (os.environ if env is None else env).get("SPARK_HOME"):
        return Path(home)
    return installed_package_dir("pyspark")


def files_key(*paths: Path) -> str:
    """A digest of the files' resolved paths, sizes and modification times: what a cached entry is for."""
    digest = hashlib.sha256()
    for path in paths:
        real = path.resolve()
        stat = real.stat()
        digest.update(f"{real}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:16]


def archive_key(java: str, jars: Path | None) -> str:
    """The key of the JVM binary and the Spark jars (what Java checks an archive against)."""
    return files_key(Path(java), *(sorted(jars.glob("*.jar")) if jars is not None and jars.is_dir() else ()))


@dataclass(frozen=True)
class ArchivePlan:
    """What one run does with the archive: map ``path``, or write ``writing`` and install it."""

    java: str
    path: Path
    writing: Path | None = None

    def java_options(self, current: str = "") -> str:
        """The archive option after the JVM's logging to stderr (the summary line must be the last on
        stdout; the writing run keeps only class-data errors), unless ``current`` sets the logging."""
        quiet = "-Xlog" not in current
        options = ["-Xlog:disable", "-Xlog:all=warning:stderr:uptime,level,tags"] if quiet else []
        if self.writing is None:
            return " ".join([*options, f"-XX:SharedArchiveFile={self.path}"])
        cds_errors = ["-Xlog:cds*=error:stderr"] if quiet else []
        return " ".join([*options, *cds_errors, f"-XX:ArchiveClassesAtExit={self.writing}"])

    def conf(self, conf: Mapping[str, str]) -> dict[str, str]:
        """``conf`` with :meth:`java_options`; unchanged when the user manages class data sharing."""
        options = self.java_options(str(conf.get(DRIVER_JAVA_OPTIONS, "")))
        return with_driver_java_option(conf, options, _USER_CDS_OPTIONS)

    def finish(self, succeeded: bool) -> bool:
        """Install the archive the run wrote if it ``succeeded`` and a JVM starts on it; else remove it."""
        if (written := self.writing) is None:
            return False
        try:
            if not succeeded or not written.is_file():
                return False
            if not _jvm_starts_on(self.java, written):
                log.warning(
                    "The JVM class-data archive %s is incomplete or unreadable; not used (the next run "
                    "writes a new one)",
                    written,
                )
                return False
            os.replace(written, self.path)
            log.info("JVM class-data archive installed: %s (later runs start faster)", self.path)
            return True
        except OSError as exc:
            log.warning("JVM class-data archive not installed (%s: %s)", type(exc).__name__, exc)
            return False
        finally:
            with contextlib.suppress(OSError):
                written.unlink()


def _jvm_starts_on(java: str, archive: Path) -> bool:
    with tempfile.TemporaryDirectory(prefix="dlq-cds-check-") as scratch:
        try:
            done = subprocess.run(
                [java, f"-XX:SharedArchiveFile={archive}", f"-XX:ErrorFile={scratch}/hs_err.log", "-version"],
                capture_output=True,
                timeout=_CHECK_TIMEOUT_S,
                cwd=scratch,
            )
        except (OSError, subprocess.SubprocessError):
            return False
    return done.returncode == 0


class ClassDataArchive:
    """The class-data archives of one cache ``directory``."""

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self.directory = Path(directory) if directory else cache_root() / "jvm-class-data"

    def plan(self, env: Mapping[str, str] | None = None) -> ArchivePlan | None:
        """The plan for a run whose spark-submit gets ``env``; ``None`` without a JVM or a usable folder."""
        java = java_binary(env)
        if java is None:
            log.info("No java found for spark-submit; starting without a JVM class-data archive")
            return None
        try:
            home = spark_home(env)
            key = archive_key(java, None if home is None else home / "jars")
            path, writing = cache_entry(self.directory, _PREFIX, key, ".jsa")
            if path.is_file():
                os.utime(path)  # in use: kept by cache_entry
                return ArchivePlan(java, path)
        except OSError as exc:
            log.info(
                "JVM class-data archive dir %s not usable (%s: %s); starting without one",
                self.directory,
                type(exc).__name__,
                exc,
            )
            return None
        log.info("No JVM class-data archive for this JVM and Spark yet: this run writes %s", path)
        return ArchivePlan(java, path, writing)


def cache_entry(directory: Path, prefix: str, key: str, suffix: str = "") -> tuple[Path, Path]:
    """``(entry, temporary)`` paths of ``key`` in ``directory`` (created), whose stale temporaries and long
    unused entries of other keys are removed first; an entry is written as the temporary, then renamed."""
    directory.mkdir(parents=True, exist_ok=True)
    now = time.time()
    for entry in directory.glob(f"{prefix}*"):
        with contextlib.suppress(OSError):
            temporary = entry.suffix == ".tmp"
            max_age = STALE_TEMP_S if temporary else UNUSED_ARCHIVE_S
            if (temporary or key not in entry.name) and now - entry.stat().st_mtime > max_age:
                if entry.is_dir():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
    return directory / f"{prefix}{key}{suffix}", directory / f"{prefix}{key}.{uuid.uuid4().hex[:12]}.tmp"
