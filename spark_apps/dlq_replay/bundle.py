"""Build the ``--py-files`` bundle of the replay app.

The zip holds ``spark_apps/**`` and a vendored copy of the consumer library
(``airflow_provider_dlq/__init__.py`` + ``airflow_provider_dlq/dlq_consumer/**``), copied at build time
from its single source in this repository. Every bundled module is checked not to import Airflow, so the
bundle runs on any Python with pyspark, pyarrow and pulsar-client. Native code (pulsar-client) cannot
travel in ``--py-files``: install it in the Spark Python environment.

    python -m spark_apps.dlq_replay.bundle --dest build/
    spark-submit --py-files build/dlq_replay.zip build/dlq_replay_main.py --help
"""

from __future__ import annotations

import argparse
import ast
import shutil
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

ZIP_NAME = "dlq_replay.zip"
MAIN_NAME = "dlq_replay_main.py"
_REPO_ROOT = Path(__file__).resolve().parents[2]
# (source folder relative to the repo root, recurse into it)
_SOURCES: tuple[tuple[str, bool], ...] = (
    ("spark_apps", True),
    ("airflow_provider_dlq", False),  # only its __init__.py: the package shell for the library
    ("airflow_provider_dlq/dlq_consumer", True),
)
_FORBIDDEN_TOP_LEVEL = "airflow"
# Fixed timestamp: the same sources give a byte-identical zip.
_ZIP_DATE = (2020, 1, 1, 0, 0, 0)


class BundleError(RuntimeError):
    """The bundle could not be built (missing sources, or a bundled module imports Airflow)."""


@dataclass(frozen=True)
class BundlePaths:
    """Where :func:`build_bundle` wrote the zip (``--py-files``) and the main file (the app)."""

    zip_path: Path
    main_path: Path


def _bundle_files(root: Path) -> list[Path]:
    files: set[Path] = set()
    for folder, recurse in _SOURCES:
        base = root / folder
        if not (base / "__init__.py").is_file():
            raise BundleError(
                f"cannot bundle {base}: not a package (no __init__.py); run from a source checkout"
            )
        found = base.rglob("*.py") if recurse else base.glob("__init__.py")
        files.update(p for p in found if "__pycache__" not in p.parts)
    return sorted(files)


def airflow_imports(source: str, filename: str) -> list[str]:
    """``"file:line"`` of every ``import airflow...`` / ``from airflow... import`` in ``source``."""
    hits = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        if any(n.split(".")[0] == _FORBIDDEN_TOP_LEVEL for n in names):
            hits.append(f"{filename}:{node.lineno}")
    return hits


def build_bundle(dest_dir: str | Path, *, source_root: str | Path | None = None) -> BundlePaths:
    """Write ``dlq_replay.zip`` and ``dlq_replay_main.py`` into ``dest_dir`` and return their paths."""
    root = Path(source_root) if source_root is not None else _REPO_ROOT
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    files = _bundle_files(root)
    offending: list[str] = []
    for path in files:
        rel = path.relative_to(root).as_posix()
        offending += airflow_imports(path.read_text(encoding="utf-8"), rel)
    if offending:
        raise BundleError(
            "the Spark bundle must not import Airflow, but these modules do: "
            + ", ".join(offending)
            + "; move the import into the Airflow provider or behind a function the app never calls"
        )
    zip_path = dest / ZIP_NAME
    tmp = zip_path.with_suffix(".zip.tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path in files:
            info = zipfile.ZipInfo(path.relative_to(root).as_posix(), date_time=_ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, path.read_bytes())
    tmp.replace(zip_path)
    main_src = root / "spark_apps" / MAIN_NAME
    if not main_src.is_file():
        raise BundleError(f"the app's main file {main_src} is missing")
    main_path = dest / MAIN_NAME
    shutil.copyfile(main_src, main_path)
    return BundlePaths(zip_path=zip_path, main_path=main_path)


def main(argv: list[str] | None = None) -> int:
    """``python -m spark_apps.dlq_replay.bundle --dest DIR``: print the zip and main paths."""
    parser = argparse.ArgumentParser(
        prog="python -m spark_apps.dlq_replay.bundle",
        allow_abbrev=False,
        description="Build the --py-files zip of the DLQ replay app with the vendored consumer library.",
    )
    parser.add_argument("--dest", required=True, help="output folder (created when missing)")
    args = parser.parse_args(argv)
    try:
        paths = build_bundle(args.dest)
    except BundleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"zip={paths.zip_path}")
    print(f"main={paths.main_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
