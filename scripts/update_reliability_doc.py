"""Copy the fault table and the broker matrix the tests wrote into the docs that show them.

The fault suite (tests/integration/faults) and the broker matrix (tests/integration/matrix) write their
tables to ``build/reliability/`` (or ``$DLQ_TEST_TABLES_DIR``), never into the docs. Run this after a
complete test run to update docs/reliability.md (both tables) and docs/apache-pulsar.md (the matrix):

    python scripts/update_reliability_doc.py

It merges the rows it finds into each doc's table: a case the build folder has replaces the doc's row of
that case, and a case it lacks keeps the row already in the doc (the command counts those). Exit code 1
when the build folder holds no table at all.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [
    str(REPO / "tests" / "integration" / "faults"),
    str(REPO / "tests" / "integration" / "matrix"),
]

import fault_support  # noqa: E402
import matrix_support  # noqa: E402


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def _report(
    name: str, source: Path, doc: Path, found: set[tuple[str, ...]], kept: set[tuple[str, ...]], changed: bool
) -> None:
    state = "updated" if changed else "unchanged"
    print(f"{name}: {len(found)} rows from {_shown(source)} -> {_shown(doc)} ({state})")
    if kept:
        groups = Counter(key[0] for key in kept)
        listed = ", ".join(f"{group} ({n})" for group, n in sorted(groups.items()))
        print(f"  {len(kept)} rows kept from the doc, not in the build folder: {listed}")


def main() -> int:
    fault_source, matrix_source = fault_support.table_file(), matrix_support.table_file()
    faults, matrix = fault_support.table_rows(fault_source), matrix_support.table_rows(matrix_source)
    if not faults and not matrix:
        print(
            f"no table in {_shown(fault_support.output_dir())}: run the fault suite and the broker matrix "
            "first (scripts/test.sh, or pytest tests/integration/faults tests/integration/matrix)",
            file=sys.stderr,
        )
        return 1
    if faults:
        doc = fault_support.DOC
        kept = set(fault_support.table_rows(doc)) - set(faults)
        changed = fault_support.merge_lines(faults, doc)
        _report("fault table", fault_source, doc, set(faults), kept, changed)
    if matrix:
        for doc in matrix_support.DOCS:
            kept = set(matrix_support.table_rows(doc)) - set(matrix)
            changed = matrix_support.merge_lines(matrix, doc)
            _report("broker matrix", matrix_source, doc, set(matrix), kept, changed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
