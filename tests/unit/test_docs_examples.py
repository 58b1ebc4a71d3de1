"""Docs show the example DAGs from their source: every ``<!-- example: FILE MARKER -->`` is followed by a
code block equal to the region of FILE between ``[START MARKER]`` and ``[END MARKER]`` (dedented)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_EXAMPLE = re.compile(r"<!-- example: (?P<file>\S+) (?P<marker>\S+) -->\n```python\n(?P<code>.*?)```", re.S)


def marked_region(path: Path, marker: str) -> str:
    text = path.read_text()
    match = re.search(rf"^[^\n]*\[START {marker}\]\n(?P<body>.*?)^[^\n]*\[END {marker}\]", text, re.S | re.M)
    assert match, f"{path} has no [START {marker}] ... [END {marker}] region"
    return textwrap.dedent(match.group("body"))


def examples() -> list[tuple[str, str, str, str]]:
    found = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        for m in _EXAMPLE.finditer(page.read_text()):
            found.append((page.name, m.group("file"), m.group("marker"), m.group("code")))
    return found


def test_pages_of_the_three_capabilities_show_their_dags():
    shown = {(page, marker) for page, _, marker, _ in examples()}
    assert ("event-driven.md", "howto_pulsar_dlq_asset_watcher") in shown
    assert ("event-driven.md", "howto_dlq_event_driven_replay") in shown
    assert ("approval.md", "howto_dlq_backfill") in shown
    assert ("canary.md", "howto_dlq_canary_replay") in shown


@pytest.mark.parametrize(("page", "file", "marker", "code"), examples(), ids=lambda v: str(v)[:40])
def test_example_block_matches_the_source(page, file, marker, code):
    assert code.strip(), f"docs/{page}: the block of {file} [{marker}] is empty"
    assert code == marked_region(ROOT / file, marker), (
        f"docs/{page}: the block of {file} [{marker}] is out of date; copy the region again"
    )
