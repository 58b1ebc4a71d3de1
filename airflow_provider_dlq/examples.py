"""Show or copy the example DAGs, playbook and fix that ship with the provider (``docs/installation.md``)."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from airflow_provider_dlq.resources import ResourceNotFoundError, example_dags_dir


def example_files() -> dict[str, Path]:
    """Every example file by its path relative to the example DAGs folder."""
    dags = example_dags_dir()
    base = dags if (dags / "playbooks").is_dir() else dags.parent / "examples"
    files = {f"{sub}/{p.name}": p for sub in ("playbooks", "fixes") for p in sorted((base / sub).glob("*.*"))}
    if not files:
        raise ResourceNotFoundError(
            f"the example playbook and fixes are missing from {base}; reinstall airflow-provider-dlq."
        )
    return {p.name: p for p in sorted(dags.glob("dlq_*.py"))} | files


def copy_examples(dest: str | Path, *, overwrite: bool = False) -> list[Path]:
    """Copy the example DAGs, playbooks and fixes into ``dest``; refuse to overwrite unless asked."""
    target = Path(dest)
    files = example_files()
    existing = [rel for rel in files if (target / rel).exists()]
    if existing and not overwrite:
        raise FileExistsError(
            f"{target} already has {', '.join(sorted(existing))}; pass --overwrite to replace them"
        )
    for rel, src in files.items():
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target / rel)
    return [target / rel for rel in files]


def main(argv: list[str] | None = None) -> int:
    """Print the example DAGs folder, or copy the examples with ``--dest``."""
    parser = argparse.ArgumentParser(
        prog="python -m airflow_provider_dlq.examples",
        description="Show or copy the provider's example DAGs, playbook and fix.",
        allow_abbrev=False,
    )
    parser.add_argument("--dest", help="copy the examples into this folder (created when missing)")
    parser.add_argument("--overwrite", action="store_true", help="replace files that already exist")
    args = parser.parse_args(argv)
    if not args.dest:
        print(example_dags_dir())
        return 0
    try:
        written = copy_examples(args.dest, overwrite=args.overwrite)
    except FileExistsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(*written, sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
