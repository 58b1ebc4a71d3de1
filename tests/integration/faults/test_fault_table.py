"""The fault table: the tests write it to the build folder; docs/reliability.md holds a complete,
machine-independent copy that ``scripts/update_reliability_doc.py`` refreshes on purpose."""

from __future__ import annotations

import re
import tempfile

from fault_support import (
    CASES,
    DOC,
    END,
    START,
    FaultRow,
    doc_cases,
    merge_into_doc,
    output_dir,
    table_file,
    table_rows,
)


def test_the_doc_table_lists_every_case_of_the_suite():
    declared = {(category, case) for category, cases in CASES.items() for case in cases}
    assert doc_cases() == declared, (
        "run the fault suite (tests/integration/faults), then python scripts/update_reliability_doc.py"
    )
    table = DOC.read_text().split(START, 1)[1].split(END, 1)[0]
    assert not re.search(r"/tmp/|/work/|/root/|/home/", table), "machine paths must be scrubbed"
    assert sum(len(v) for k, v in CASES.items() if k.startswith("bad-")) >= 20


def test_merging_rows_keeps_other_cases_orders_them_and_scrubs_paths(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(f"intro\n\n{START}\n| x |\n{END}\n\noutro\n")
    where = f"{tempfile.gettempdir()}/pytest-of-x/pytest-1/t0/out/runs"  # the session's temp dir
    first = FaultRow("kill", "commit", "f", "e", f"ok in {where}", 0, 0, 90)
    merge_into_doc([first], doc)
    merge_into_doc([FaultRow("kill", "plan", "f", "e", "topic orders-0a1b2c3d done", 0, 0, 90)], doc)
    text = doc.read_text()
    assert text.startswith("intro\n\n")
    assert text.endswith("\n\noutro\n")
    rows = [line for line in text.splitlines() if line.startswith("| kill")]
    assert [r.split(" | ")[1] for r in rows] == ["`plan`", "`commit`"]  # CASES order, both kept
    assert "orders-<id>" in rows[0]
    assert "<tmp>/runs" in rows[1]
    before = doc.read_text()
    merge_into_doc([first], doc)  # the same result again: the file does not change
    assert doc.read_text() == before


def test_rows_go_to_the_build_folder_named_by_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("DLQ_TEST_TABLES_DIR", str(tmp_path / "tables"))
    assert output_dir() == (tmp_path / "tables").resolve()
    doc_before = DOC.read_text()
    merge_into_doc([FaultRow("kill", "plan", "f", "e", "ok", 0, 0, 90)])
    assert list(table_rows(table_file())) == [("kill", "plan")]
    assert DOC.read_text() == doc_before  # the doc changes only through the update command
