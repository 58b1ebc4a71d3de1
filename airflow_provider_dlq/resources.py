"""Where the provider's Spark app, example DAGs and guides are: in the package, else in a source checkout."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from airflow_provider_dlq.errors import DlqProviderError

PACKAGE_DIR = Path(__file__).resolve().parent
_CHECKOUT = PACKAGE_DIR.parent


class ResourceNotFoundError(DlqProviderError, FileNotFoundError):
    """A part of the provider is missing from both the installed package and a source checkout."""


def installed_package_dir(name: str) -> Path | None:
    """The folder of the installed package ``name`` (found without importing it), else ``None``."""
    spec = importlib.util.find_spec(name)
    locations = spec.submodule_search_locations if spec is not None else None
    return Path(next(iter(locations))) if locations else None


def _find(what: str, packaged: str, checkout: str, marker: str, hint: str = "") -> Path:
    """The installed (``packaged``) or source-checkout folder holding ``marker`` (a glob)."""
    for candidate in (PACKAGE_DIR / packaged, _CHECKOUT / checkout):
        if any(candidate.glob(marker)):
            return candidate
    raise ResourceNotFoundError(
        f"the {what} neither in the installed provider ({PACKAGE_DIR / packaged}) nor in a source checkout "
        f"({_CHECKOUT / checkout}); reinstall airflow-provider-dlq from its wheel{hint}."
    )


def spark_app_dir() -> Path:
    """The ``spark_apps`` package folder (its ``dlq_replay/`` and ``dlq_replay_main.py``)."""
    hint = ", or pass bundle_path= and application= to DlqReplayOperator"
    return _find("Spark replay app is", "spark_apps", "spark_apps", "dlq_replay_main.py", hint)


def example_dags_dir() -> Path:
    """The example DAGs folder (``playbooks/`` and ``fixes/`` inside it in the wheel)."""
    return _find("example DAGs are", "example_dags", "dags", "dlq_*.py")


def docs_dir() -> Path:
    """The user guides (``docs/*.md``)."""
    return _find("guides are", "docs", "docs", "operator.md")
