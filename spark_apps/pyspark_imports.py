"""Import PySpark from a compiled copy of spark-submit's zips when the run has one: a faster start.

The copy is made by ``airflow_provider_dlq.compiled_pyspark`` (see ``docs/operator.md``); this module is
the workers' daemon too. Standard library only: nothing imports PySpark before."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

#: The file that marks a compiled copy and names the zips it was made from (size and mtime of each).
MARKER = "dlq-compiled-pyspark.json"
#: The name of this module's copy in the compiled folder: the workers' ``spark.python.daemon.module``.
DAEMON_MODULE = "dlq_pyspark_daemon"
#: The environment variable that names the compiled folder to the driver.
FOLDER_ENV = "DLQ_COMPILED_PYSPARK"


def _made_from(marker: str) -> dict[str, Any] | None:
    try:
        with open(marker, encoding="utf-8") as handle:
            zips = json.load(handle)["zips"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return zips if isinstance(zips, dict) and zips else None


def _same_file(path: str, expected: Any) -> bool:
    try:
        stat = os.stat(path)
        return stat.st_size == int(expected["size"]) and stat.st_mtime_ns == int(expected["mtime_ns"])
    except (OSError, KeyError, TypeError, ValueError):
        return False


def prefer_compiled(path: list[str] | None = None) -> str | None:
    """Put the compiled copy :data:`FOLDER_ENV` names, or the first one on ``path`` (default ``sys.path``),
    ahead of the zips on ``path`` it was made from; returns its folder, or ``None`` (PySpark imported
    already, no copy, or other zips: ``path`` stays as it is)."""
    entries = sys.path if path is None else path
    if "pyspark" in sys.modules:
        return None
    for candidate in [os.environ.get(FOLDER_ENV, ""), *entries]:
        zips = _made_from(os.path.join(candidate, MARKER)) if candidate else None
        if zips is None:
            continue
        positions = [i for i, entry in enumerate(entries) if os.path.basename(entry) in zips]
        found = [(entries[i], zips[os.path.basename(entries[i])]) for i in positions]
        if {os.path.basename(p) for p, _ in found} != set(zips) or not all(_same_file(*f) for f in found):
            continue
        if candidate in entries:
            if entries.index(candidate) < positions[0]:
                return candidate
            entries.remove(candidate)  # after the first zip: that zip's position does not move
        entries.insert(positions[0], candidate)
        return candidate
    return None


def main() -> None:
    """The Python workers' daemon: PySpark's own, imported from the compiled copy."""
    prefer_compiled()
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
