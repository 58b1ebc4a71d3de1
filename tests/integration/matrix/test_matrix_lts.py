"""The stated subset on Apache Pulsar 4.0 LTS (``PULSAR_VERSION``, the project's own standalone.conf): the
end-to-end replay (dry-run, replay with late arrivals, re-runs) and the kill case during apply, then
resume. The rest of the suite runs on the newest release tested, the session broker (``tests/conftest.py``).

The tests are the suite's own: each is called with this module's fixtures (``pulsar_broker`` and
``pulsar_client`` here are the LTS broker's), so a change to a test applies to both versions.
"""

from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from matrix_support import DEFAULT_LABEL, MatrixRow

HERE = Path(__file__).resolve().parent
for suite in ("replay", "faults"):  # the suites whose tests run here too
    if str(HERE.parent / suite) not in sys.path:
        sys.path.insert(0, str(HERE.parent / suite))

import test_fault_kills as kills  # noqa: E402
import test_replay_e2e as e2e  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def pulsar_broker() -> Iterator[Any]:
    """Apache Pulsar 4.0 LTS for this module (free loopback ports, stopped by PID, data deleted)."""
    from pulsar_standalone import PULSAR_VERSION, start_standalone

    broker = start_standalone(version=PULSAR_VERSION)  # the tests here use public/default
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def pulsar_client(pulsar_broker: Any) -> Iterator[Any]:
    import pulsar

    client = pulsar.Client(
        pulsar_broker.service_url, logger=logging.getLogger("pulsar.test"), operation_timeout_seconds=30
    )
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="module")
def fault_bundle(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from airflow_provider_dlq.bundle import build_bundle

    return build_bundle(tmp_path_factory.mktemp("matrix-bundle"))


class _KillRows:
    """Stands in for the fault suite's ``fault_table``: the kill row goes into the broker matrix."""

    def __init__(self, version: str, table: Any) -> None:
        self.version = version
        self.table = table

    def record(self, row: Any) -> None:
        self.table.record(
            MatrixRow(
                self.version,
                DEFAULT_LABEL,
                "kill during apply, then resume",
                row.result,
                row.lost,
                row.doubled,
                row.pending,
            )
        )


@pytest.fixture
def fault_table(pulsar_broker: Any, matrix_table: Any) -> _KillRows:
    return _KillRows(pulsar_broker.version, matrix_table)


def run_suite_test(request: pytest.FixtureRequest, test: Callable[..., Any], **given: Any) -> None:
    """Call ``test`` with this module's fixtures for each parameter it names (``given`` first)."""
    names = inspect.signature(test).parameters
    test(**{name: given[name] if name in given else request.getfixturevalue(name) for name in names})


def test_end_to_end_replay_on_the_lts(request, pulsar_broker, matrix_table):
    run_suite_test(request, e2e.test_mixed_dlq_dry_run_then_replay_then_reruns)
    matrix_table.record(
        MatrixRow(
            pulsar_broker.version,
            DEFAULT_LABEL,
            "end-to-end replay",
            "passed: dry-run changes nothing; replay exact in reader mode (one read per message), late "
            "arrivals wait, re-runs republish nothing twice (test_replay_e2e)",
            0,
            0,
        )
    )


def test_kill_during_apply_then_resume_on_the_lts(request):
    # The row (lost, doubled, pending) is recorded by the test itself through ``fault_table``.
    run_suite_test(request, kills.kill_in_turn_then_resume, steps=("apply",))
