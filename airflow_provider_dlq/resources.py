"""Where the provider's non-Python parts are: the Spark app, the example DAGs and the guides.

In the wheel they are inside the package (``spark_apps/``, ``example_dags/``, ``docs/``); in a source
checkout they stay at the repository's top level. Nothing is imported from them.
"""

from __future__ import annotations

from pathlib import Path

from airflow_provider_dlq.errors import DlqProviderError

PACKAGE_DIR = Path(__file__).resolve().parent
_CHECKOUT = PACKAGE_DIR.parent


class ResourceNotFoundError(DlqProviderError, FileNotFoundError):
    """A part of the provider is missing from both the installed package and a source checkout."""


def spark_app_dir() -> Path:
    """The ``spark_apps`` package folder (its ``dlq_replay/`` and ``dlq_replay_main.py``)."""
    for candidate in (PACKAGE_DIR / "spark_apps", _CHECKOUT / "spark_apps"):
        if (candidate / "__init__.py").is_file() and (candidate / "dlq_replay_main.py").is_file():
            return candidate
    raise ResourceNotFoundError(
        f"the Spark replay app is neither in the installed provider ({PACKAGE_DIR / 'spark_apps'}) nor in "
        f"a source checkout ({_CHECKOUT / 'spark_apps'}); reinstall airflow-provider-dlq from its wheel, "
        "or pass bundle_path= and application= to DlqReplayOperator."
    )


def example_dags_dir() -> Path:
    """The example DAGs folder (``playbooks/`` and ``fixes/`` inside it in the wheel)."""
    for candidate in (PACKAGE_DIR / "example_dags", _CHECKOUT / "dags"):
        if candidate.is_dir() and any(candidate.glob("dlq_*.py")):
            return candidate
    raise ResourceNotFoundError(
        f"the example DAGs are neither in the installed provider ({PACKAGE_DIR / 'example_dags'}) nor in "
        f"a source checkout ({_CHECKOUT / 'dags'}); reinstall airflow-provider-dlq from its wheel."
    )


def docs_dir() -> Path:
    """The user guides (``docs/*.md``; ``airflow_provider_dlq/docs`` in the wheel)."""
    for candidate in (PACKAGE_DIR / "docs", _CHECKOUT / "docs"):
        if (candidate / "operator.md").is_file():
            return candidate
    raise ResourceNotFoundError(
        f"the guides are neither in the installed provider ({PACKAGE_DIR / 'docs'}) nor in a source "
        f"checkout ({_CHECKOUT / 'docs'}); reinstall airflow-provider-dlq from its wheel."
    )


def example_playbook_files() -> dict[str, Path]:
    """The example playbook and fix files by their path relative to the example DAGs folder."""
    packaged = PACKAGE_DIR / "example_dags"
    base = packaged if (packaged / "playbooks").is_dir() else _CHECKOUT / "examples"
    files = {f"{sub}/{p.name}": p for sub in ("playbooks", "fixes") for p in sorted((base / sub).glob("*.*"))}
    if not files:
        raise ResourceNotFoundError(
            f"the example playbook and fixes are missing from {base}; reinstall airflow-provider-dlq."
        )
    return files
