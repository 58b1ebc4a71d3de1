"""Generate ``get_provider_info.py`` from ``provider.yaml``, the provider's one metadata source.

``python -m airflow_provider_dlq.provider_metadata`` rewrites it; ``--check`` exits 1 when it is stale.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import yaml

PACKAGE_DIR = Path(__file__).resolve().parent
PROVIDER_YAML = PACKAGE_DIR / "provider.yaml"
GENERATED = PACKAGE_DIR / "get_provider_info.py"

#: provider.yaml keys that are packaging-only and not part of the runtime provider info.
_BUILD_ONLY_KEYS = ("state", "lifecycle", "build-system", "source-date-epoch", "extra-project-metadata")

_HEADER = '''"""Provider metadata for Airflow's providers manager (entry point ``apache_airflow_provider``).

GENERATED from ``provider.yaml`` by ``python -m airflow_provider_dlq.provider_metadata``: edit the YAML,
then regenerate; never edit this file by hand.
"""

from __future__ import annotations

from typing import Any


def get_provider_info() -> dict[str, Any]:
    """Return the provider description: package, versions, connection type, links, plugin, modules."""
    return '''


def load_provider_yaml(path: Path = PROVIDER_YAML) -> dict[str, Any]:
    """The parsed ``provider.yaml``."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a mapping of provider metadata")
    return data


def provider_info(data: dict[str, Any]) -> dict[str, Any]:
    """The runtime provider info for ``provider.yaml`` data (build-only keys removed)."""
    return {key: value for key, value in data.items() if key not in _BUILD_ONLY_KEYS}


def _literal(value: Any) -> str:
    """Python source of ``value``, long strings split at spaces into joined pieces (ruff lays it out)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    pieces = textwrap.wrap(value, 70, drop_whitespace=False) if isinstance(value, str) else []
    if len(pieces) > 1 and "".join(pieces) == value:
        return "(" + " ".join(map(repr, pieces)) + ")"
    return repr(value)


def render(info: dict[str, Any]) -> str:
    """Source of ``get_provider_info.py`` for ``info`` (ruff-formatted when ruff is available)."""
    source = _HEADER + _literal(info) + "\n"
    ruff = shutil.which("ruff")
    if ruff is None:
        return source
    done = subprocess.run(
        [ruff, "format", "--stdin-filename", str(GENERATED), "-"],
        input=source,
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout if done.returncode == 0 else source


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None, allow_abbrev=False
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if get_provider_info.py is stale")
    args = parser.parse_args(argv)
    wanted = render(provider_info(load_provider_yaml()))
    current = GENERATED.read_text(encoding="utf-8") if GENERATED.exists() else ""
    if args.check:
        if current != wanted:
            print(f"{GENERATED.name} is out of date; run python -m airflow_provider_dlq.provider_metadata")
            return 1
        return 0
    if current != wanted:
        GENERATED.write_text(wanted, encoding="utf-8")
        print(f"wrote {GENERATED.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
