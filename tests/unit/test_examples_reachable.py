"""The example DAGs, playbook and fix are reachable from the provider (checkout layout here; the wheel
test checks the installed layout)."""

from __future__ import annotations

import yaml

from airflow_provider_dlq.examples import copy_examples, example_files, main


def test_examples_are_found_with_the_playbook_and_its_fix() -> None:
    files = example_files()
    assert {
        "dlq_nightly_replay.py",
        "dlq_backfill.py",
        "playbooks/orders.yaml",
        "fixes/orders_fixes.py",
    } <= set(files)
    assert all(path.is_file() for path in files.values())


def test_copy_keeps_the_playbook_fix_path_working(tmp_path, capsys) -> None:
    assert main(["--dest", str(tmp_path)]) == 0
    playbook = tmp_path / "playbooks" / "orders.yaml"
    for fix_file in yaml.safe_load(playbook.read_text())["fix_files"]:
        assert (playbook.parent / fix_file).resolve().is_file()
    assert str(playbook) in capsys.readouterr().out
    assert main(["--dest", str(tmp_path)]) == 2  # never overwrites silently
    assert "pass --overwrite" in capsys.readouterr().err
    assert len(copy_examples(tmp_path, overwrite=True)) == len(example_files())
