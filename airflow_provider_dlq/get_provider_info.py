"""Provider metadata for Airflow's providers manager (entry point ``apache_airflow_provider``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def get_provider_info() -> dict[str, Any]:
    """The provider description of ``provider.yaml``: package, versions, connection type, links, modules."""
    return dict(yaml.safe_load((Path(__file__).parent / "provider.yaml").read_text(encoding="utf-8")))
