"""The broker matrix's shared parts: production broker settings, tokens and grants, and the matrix table
(version x setting x result).

Each matrix test records one row per case through the session fixture ``matrix_table``; each row is
merged at once into ``build/reliability/broker-matrix.md`` (the fault suite's ``output_dir``; rows of
cases not run this session are kept), in :data:`CASES` order. The tests never write the docs:
``python scripts/update_reliability_doc.py`` copies the rows into docs/apache-pulsar.md and
docs/reliability.md on purpose.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import urllib.error
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jwt

REPO = Path(__file__).resolve().parents[3]
#: The docs that hold a copy of the matrix (see ``scripts/update_reliability_doc.py``).
DOCS = (REPO / "docs" / "apache-pulsar.md", REPO / "docs" / "reliability.md")
TABLE_FILE = "broker-matrix.md"
START = (
    "<!-- broker-matrix:start: the broker matrix's output (tests/integration/matrix), copied here by "
    "scripts/update_reliability_doc.py; do not edit -->"
)
END = "<!-- broker-matrix:end -->"
HEADER = (
    "| Apache Pulsar | broker settings | case | result | lost | doubled | pending |\n"
    "|---|---|---|---|---:|---:|---:|"
)
#: Every case of the matrix, in table order.
CASES = (
    "end-to-end replay",
    "kill during apply, then resume",
    "partitioned DLQ and origin",
    "least-privilege replay",
    "lease topic not created",
    "origin topic not created",
    "no consume on the DLQ",
    "no produce on one origin",
    "no admin REST",
    "admin REST refused",
)

#: The broker settings production clusters commonly run with, on one broker (they do not interfere):
#: batch-index acknowledgement on, topic auto-creation off, token authentication and authorization on.
PRODUCTION_SETTINGS: dict[str, str] = {
    "acknowledgmentAtBatchIndexLevelEnabled": "true",
    "allowAutoTopicCreation": "false",
    "authenticationEnabled": "true",
    "authenticationProviders": "org.apache.pulsar.broker.authentication.AuthenticationProviderToken",
    "authorizationEnabled": "true",
    "brokerClientAuthenticationPlugin": "org.apache.pulsar.client.impl.auth.AuthenticationToken",
}
PRODUCTION_LABEL = "token auth + authorization, topic auto-creation off, batch-index ack on"
DEFAULT_LABEL = "the project's standalone.conf (auto-creation on, no auth, broker dedup on)"
SUPERUSER, REPLAYER = "admin", "replayer"

#: The run's exit code for each error it raises, as ``spark_apps.dlq_replay.cli.main`` maps them.
EXIT_USAGE, EXIT_FAILED = 2, 1


def exit_code_of(exc: BaseException) -> int:
    """The exit code ``cli.main`` gives a run that raised ``exc`` (in-process runs raise, spark-submit
    runs exit): invalid input or a missing permission found before anything is written exits 2."""
    from spark_apps.dlq_replay.errors import ReplayConfigError
    from spark_apps.dlq_replay.pulsar_io.errors import PulsarConfigError

    return EXIT_USAGE if isinstance(exc, (ReplayConfigError, PulsarConfigError)) else EXIT_FAILED


@dataclass(frozen=True)
class MatrixRow:
    """One case of the matrix on one broker."""

    version: str
    settings: str
    case: str
    result: str
    lost: int | str = "-"
    doubled: int | str = "-"
    pending: int | str = "-"

    def line(self) -> str:
        cells = [self.version, self.settings, self.case, scrub(self.result)]
        cells += [str(self.lost), str(self.doubled), str(self.pending)]
        return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"


def _fault_support() -> Any:
    """The fault suite's support module (its scrubbing, output folder and lock are shared)."""
    sys.path.insert(0, str(REPO / "tests" / "integration" / "faults"))
    try:
        import fault_support
    finally:
        sys.path.pop(0)
    return fault_support


def table_file() -> Path:
    """The matrix the tests of this machine wrote (the rows of every case run so far)."""
    return Path(_fault_support().output_dir()) / TABLE_FILE


def scrub(text: str) -> str:
    """The text without what differs from run to run (random topic ids, ports, temp paths)."""
    import re

    text = re.sub(r"dlq-replay-lease-[0-9a-f]+", "dlq-replay-lease-<hash>", _fault_support().scrub(text))
    return re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:<port>", text)


def _parse_rows(text: str) -> dict[tuple[str, str, str], str]:
    rows: dict[tuple[str, str, str], str] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) >= 3 and cells[2] in CASES:
            rows[(cells[0], cells[1], cells[2])] = line.strip()
    return rows


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else 0 for p in version.split("."))


def merge_lines(lines: dict[tuple[str, str, str], str], doc: Path) -> bool:
    """Write the matrix ``lines`` (by (version, settings, case)) into ``doc``, ordered by version, then
    :data:`CASES` (see the fault suite's ``merge_table``)."""

    def key(item: tuple[tuple[str, str, str], str]) -> tuple[tuple[int, ...], int]:
        return (_version_key(item[0][0]), CASES.index(item[0][2]))

    return bool(_fault_support().merge_table(doc, (START, END, HEADER), lines, _parse_rows, key))


def merge_into_doc(rows: list[MatrixRow], doc: Path | None = None) -> None:
    """Write ``rows`` into the matrix of ``doc`` (default: :func:`table_file`, in the build folder),
    keeping the rows of cases not run now."""
    path = doc or table_file()
    with _fault_support().locked(path):
        merge_lines({(row.version, row.settings, row.case): row.line() for row in rows}, path)


def table_rows(doc: Path) -> dict[tuple[str, str, str], str]:
    """The rows of the matrix in ``doc``; none when ``doc`` does not exist."""
    rows: dict[tuple[str, str, str], str] = _fault_support().read_table(doc, (START, END), _parse_rows)
    return rows


# --------------------------------------------------------------------------- versions


def production_versions() -> tuple[str, ...]:
    """The versions the production-settings broker runs on: ``DLQ_TEST_PRODUCTION_VERSIONS`` (comma
    separated), else the newest tested version."""
    from pulsar_standalone import PULSAR_NEWEST_VERSION

    given = os.environ.get("DLQ_TEST_PRODUCTION_VERSIONS", "")
    return tuple(v.strip() for v in given.split(",") if v.strip()) or (PULSAR_NEWEST_VERSION,)


# --------------------------------------------------------------------------- tokens and grants


@dataclass
class SecuredBroker:
    """A production-settings broker with its superuser and replayer tokens."""

    broker: Any
    secret: bytes
    folder: Path

    @property
    def version(self) -> str:
        return str(self.broker.version)

    def token(self, role: str) -> str:
        return jwt.encode({"sub": role}, self.secret, algorithm="HS256")

    def token_file(self, role: str) -> str:
        path = self.folder / f"{role}-{secrets.token_hex(3)}.token"
        path.write_text(self.token(role))
        path.chmod(0o600)
        return str(path)

    def admin(self) -> Any:
        return self.broker.admin()

    def client(self, role: str = SUPERUSER) -> Any:
        import logging

        import pulsar

        return pulsar.Client(
            self.broker.service_url,
            authentication=pulsar.AuthenticationToken(self.token(role)),
            logger=logging.getLogger("pulsar.test"),
            operation_timeout_seconds=15,
        )

    def create_topic(self, topic: str, partitions: int = 0) -> None:
        """Create ``topic`` as the superuser (auto-creation is off): partitioned when ``partitions``."""
        path = "/admin/v2/" + topic.replace("persistent://", "persistent/", 1)
        if partitions:  # the first topic of a namespace loads its bundle: allow a loaded machine time
            self.admin().request("PUT", f"{path}/partitions", partitions, timeout=60)
        else:
            self.admin().request("PUT", path, timeout=60)

    def grant(self, topic: str, role: str, *actions: str) -> None:
        """Grant ``role`` the ``actions`` (``produce``, ``consume``) on one topic (a partitioned topic's
        grant covers its partitions)."""
        tenant, namespace, name = topic.replace("persistent://", "", 1).split("/", 2)
        path = f"/admin/v2/persistent/{tenant}/{namespace}/{quote(name, safe='')}/permissions/{role}"
        self.admin().request("POST", path, list(actions), timeout=60)

    def backlog(self, topic: str, subscription: str = "dlq-replayer") -> int:
        """Messages ``subscription`` has not acked on ``topic`` (admin REST, summed over partitions)."""
        path = "/admin/v2/" + topic.replace("persistent://", "persistent/", 1)
        try:
            stats = self.admin().get(f"{path}/partitioned-stats")
        except urllib.error.HTTPError:
            stats = self.admin().get(f"{path}/stats")
        sub = stats.get("subscriptions", {}).get(subscription)
        return int(sub["msgBacklog"]) if sub else -1


def summary(report: dict[str, Any], *names: str) -> str:
    totals = report["totals"]
    return ", ".join(f"{n} {totals[n]}" for n in names if totals.get(n))


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True)
