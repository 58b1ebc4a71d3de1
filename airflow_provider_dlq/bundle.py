"""Build the replay app's ``--py-files`` bundle: the Spark app and a vendored copy of the consumer library,
compiled and checked not to import Airflow (``docs/architecture.md``)."""

from __future__ import annotations

import argparse
import ast
import py_compile
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from airflow_provider_dlq.errors import DlqProviderError
from airflow_provider_dlq.resources import installed_package_dir, spark_app_dir

ZIP_NAME = "dlq_replay.zip"
MAIN_NAME = "dlq_replay_main.py"
#: Package names inside the zip, as the app's modules import them.
APP_PACKAGE = "spark_apps"
LIBRARY_PACKAGE = "pulsar_dlq_consumer"
# Fixed timestamp: the same sources give a byte-identical zip.
_ZIP_DATE = (2020, 1, 1, 0, 0, 0)


class BundleError(DlqProviderError, RuntimeError):
    """The bundle could not be built (missing sources, or a bundled module imports Airflow)."""


@dataclass(frozen=True)
class BundlePaths:
    """Where :func:`build_bundle` wrote the zip (``--py-files``) and the main file (the app)."""

    zip_path: Path
    main_path: Path


def library_dir() -> Path:
    """The folder of the installed ``pulsar_dlq_consumer`` package (found without importing it)."""
    found = installed_package_dir(LIBRARY_PACKAGE)
    if found is None:
        raise BundleError(
            f"the consumer library {LIBRARY_PACKAGE} is not installed; pip install pulsar-dlq-consumer "
            "(airflow-provider-dlq depends on it)"
        )
    return found


def _bundle_files(app_dir: Path, lib_dir: Path) -> list[tuple[str, Path]]:
    """``(name in the zip, source file)`` of every module to bundle, sorted by name."""
    files: dict[str, Path] = {}
    for package, base in ((APP_PACKAGE, app_dir), (LIBRARY_PACKAGE, lib_dir)):
        if not (base / "__init__.py").is_file():
            raise BundleError(f"cannot bundle {base} as {package}: not a package (no __init__.py)")
        for path in base.rglob("*.py"):
            if "__pycache__" not in path.parts:
                files[f"{package}/{path.relative_to(base).as_posix()}"] = path
    return sorted(files.items())


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
        if any(n.split(".")[0] == "airflow" for n in names):
            hits.append(f"{filename}:{node.lineno}")
    return hits


def build_bundle(
    dest_dir: str | Path, *, app_dir: str | Path | None = None, lib_dir: str | Path | None = None
) -> BundlePaths:
    """Write ``dlq_replay.zip`` and ``dlq_replay_main.py`` into ``dest_dir`` (from the installed app and
    library unless ``app_dir`` / ``lib_dir`` are given)."""
    app = Path(app_dir) if app_dir is not None else spark_app_dir()
    lib = Path(lib_dir) if lib_dir is not None else library_dir()
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    files = _bundle_files(app, lib)
    offending = [hit for rel, path in files for hit in airflow_imports(path.read_text(encoding="utf-8"), rel)]
    if offending:
        raise BundleError(
            "the Spark bundle must not import Airflow, but these modules do: "
            + ", ".join(offending)
            + "; move the import into the Airflow provider or behind a function the app never calls"
        )
    zip_path = dest / ZIP_NAME
    tmp = zip_path.with_suffix(".zip.tmp")
    with (
        zipfile.ZipFile(tmp, "w") as archive,
        tempfile.TemporaryDirectory(prefix="dlq-bundle-pyc-") as scratch,
    ):
        for rel, path in files:
            _add(archive, rel, path.read_bytes())
            # Compiled next to the source, so no process of the run compiles it; a checked-hash pyc is used
            # only while it matches the source, and only by the Python version that wrote it.
            _add(archive, rel + "c", _compiled(path, rel, Path(scratch)))
    tmp.replace(zip_path)
    main_src = app / MAIN_NAME
    if not main_src.is_file():
        raise BundleError(f"the app's main file {main_src} is missing")
    shutil.copyfile(main_src, dest / MAIN_NAME)
    return BundlePaths(zip_path=zip_path, main_path=dest / MAIN_NAME)


def _add(archive: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=_ZIP_DATE)
    info.external_attr = 0o644 << 16
    archive.writestr(info, data, zipfile.ZIP_DEFLATED)


def _compiled(source: Path, name: str, scratch: Path) -> bytes:
    """``source`` as a checked-hash ``.pyc`` (PEP 552) named ``name`` in tracebacks."""
    out = scratch / "module.pyc"
    py_compile.compile(
        str(source),
        cfile=str(out),
        dfile=name,
        doraise=True,
        invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
    )
    return out.read_bytes()


def main(argv: list[str] | None = None) -> int:
    """``python -m airflow_provider_dlq.bundle --dest DIR``: print the zip and main paths."""
    parser = argparse.ArgumentParser(
        prog="python -m airflow_provider_dlq.bundle",
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
    print(f"zip={paths.zip_path}", f"main={paths.main_path}", sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
