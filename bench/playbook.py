"""The replay app's playbook for the benchmark, generated from :mod:`bench.workload` (one source).

Rule 1 archives the four non-replayable error classes, rule 2 fixes and republishes everything else
with ``bench_fixes:fix_order``. The fix file is shipped to Spark through ``fix_files``.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from bench import workload

FIX_FILE = Path(__file__).resolve().parent / "bench_fixes.py"
FIX_REF = "bench_fixes:fix_order"
FIX_VERSION = "1"


def playbook_document(fix_file: Path = FIX_FILE) -> dict[str, object]:
    """The playbook as a YAML-ready mapping (schema: the replay app's docs/playbook.md)."""
    archive_classes = sorted(workload.ARCHIVE_CLASSES)
    return {
        "version": 1,
        "fix_files": [str(fix_file)],
        "rules": [
            {
                "name": "archive-not-replayable",
                "description": "orders that must never be processed again",
                "match": {"error_class": [f"^{re.escape(c)}$" for c in archive_classes]},
                "action": "archive",
                "reason": "not replayable: customer, catalogue or fraud decision",
            },
            {
                "name": "fix-and-republish",
                "description": "decimal-comma amounts and missing currency: fixed by bench_fixes.fix_order",
                "action": "republish",
                "fix": FIX_REF,
                "fix_version": FIX_VERSION,
            },
        ],
    }


def write_playbook(path: Path, fix_file: Path = FIX_FILE) -> Path:
    """Write the playbook YAML to ``path`` and return it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(playbook_document(fix_file), sort_keys=False))
    return path
