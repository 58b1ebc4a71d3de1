"""Assemble the broker's classpath from Maven Central once, then start offline from the cache.

``mvn dependency:build-classpath`` over our ``pom.xml`` (with ``-Dpulsar.version=<version>``) downloads
the jars into a private local repository under the cache dir and writes ``classpath.txt``. The cache
entry is keyed by the Apache Pulsar version and the pom's digest, so a changed pom resolves again; a
cache whose jars are all present is used without Maven.

Cache dir: ``PULSAR_STANDALONE_CACHE``, else ``$XDG_CACHE_HOME/airflow-provider-dlq``, else
``~/.cache/airflow-provider-dlq``.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from pulsar_standalone.errors import StandaloneError
from pulsar_standalone.versions import PULSAR_VERSION

log = logging.getLogger(__name__)

PACKAGE_DIR = Path(__file__).resolve().parent
POM = PACKAGE_DIR / "pom.xml"
MAVEN_SETTINGS = PACKAGE_DIR / "maven-settings.xml"
_MVN_TIMEOUT_S = 1800


@dataclass(frozen=True)
class Classpath:
    """The jars of the broker and how they were obtained."""

    jars: tuple[Path, ...]
    cache_dir: Path
    resolved_in_s: float | None  # None: taken from the cache, offline

    def __str__(self) -> str:
        return os.pathsep.join(str(j) for j in self.jars)


def cache_root() -> Path:
    """The user cache dir for the Maven repository and resolved classpaths."""
    if os.environ.get("PULSAR_STANDALONE_CACHE"):
        return Path(os.environ["PULSAR_STANDALONE_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "airflow-provider-dlq"


def _entry_dir(version: str) -> Path:
    digest = hashlib.sha256(POM.read_bytes()).hexdigest()[:12]
    return cache_root() / f"pulsar-{version}-{digest}"


def _cached(entry: Path) -> tuple[Path, ...] | None:
    listing = entry / "classpath.txt"
    if not listing.is_file():
        return None
    jars = tuple(Path(p) for p in listing.read_text().strip().split(os.pathsep) if p)
    if not jars or not all(j.is_file() for j in jars):
        return None
    return jars


def resolve_classpath(version: str = PULSAR_VERSION, *, offline_only: bool = False) -> Classpath:
    """The classpath of Apache Pulsar ``version``, resolved with Maven on first use (about 250 MB of jars).

    Raises :class:`StandaloneError` naming the fix when Maven is missing, Maven Central is unreachable or
    does not serve that version's jars.
    """
    _check_version(version)
    entry = _entry_dir(version)
    jars = _cached(entry)
    if jars is not None:
        return Classpath(jars, entry, None)
    if offline_only:
        raise StandaloneError(
            f"no cached Apache Pulsar {version} classpath in {entry}; run "
            f"`python -m pulsar_standalone classpath --version {version}` once with access to Maven Central"
        )
    entry.mkdir(parents=True, exist_ok=True)
    with (entry / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be resolving the same entry
        jars = _cached(entry)
        if jars is not None:
            return Classpath(jars, entry, None)
        started = time.monotonic()
        _run_maven(entry, version)
        jars = _cached(entry)
        if jars is None:
            raise StandaloneError(f"Maven wrote no usable classpath to {entry / 'classpath.txt'}")
        return Classpath(jars, entry, time.monotonic() - started)


def _check_version(version: str) -> None:
    parts = version.split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise StandaloneError(
            f"an Apache Pulsar version is three numbers such as {PULSAR_VERSION!r}; got {version!r}"
        )


def _run_maven(entry: Path, version: str) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise StandaloneError(
            "Apache Maven (`mvn`) is needed once to fetch Apache Pulsar's jars from Maven Central; install "
            "it (e.g. `apt-get install maven`) or copy a resolved cache dir into "
            f"{cache_root()} (set PULSAR_STANDALONE_CACHE to use another)"
        )
    settings = os.environ.get("PULSAR_STANDALONE_MAVEN_SETTINGS") or str(MAVEN_SETTINGS)
    partial = entry / "classpath.txt.partial"
    cmd = [
        mvn,
        "--batch-mode",
        "--quiet",
        "--no-transfer-progress",
        "--settings",
        settings,
        "--file",
        str(POM),
        f"-Dmaven.repo.local={cache_root() / 'm2'}",
        f"-Dpulsar.version={version}",
        "dependency:build-classpath",
        f"-Dmdep.outputFile={partial}",
        "-Dmdep.includeScope=runtime",
    ]
    log.info("resolving Apache Pulsar %s from Maven Central into %s", version, cache_root())
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_MVN_TIMEOUT_S, check=False)
    if proc.returncode != 0 or not partial.is_file():
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise StandaloneError(
            f"Maven could not resolve Apache Pulsar {version} (exit {proc.returncode}). Check that the "
            f"repository serves org.apache.pulsar:pulsar-broker:{version} and access to "
            f"https://repo.maven.apache.org (or set PULSAR_STANDALONE_MAVEN_SETTINGS to a settings.xml "
            f"with your mirror). Maven said:\n{tail}"
        )
    os.replace(partial, entry / "classpath.txt")
