"""Fixtures of the fault suite: the results table (written into the build folder as rows are recorded,
see ``fault_support.output_dir``) and the spark-submit bundle."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fault_support import CASES, FaultRow, merge_into_doc


class FaultTable:
    """Rows recorded by the fault tests of this session."""

    def __init__(self) -> None:
        self.rows: list[FaultRow] = []

    def record(self, row: FaultRow) -> None:
        assert row.case in CASES[row.category], f"declare case {row.case!r} in fault_support.CASES"
        self.rows.append(row)
        merge_into_doc([row])  # at once: a session cut short keeps the rows of the cases it finished


@pytest.fixture(scope="session")
def fault_table() -> FaultTable:
    return FaultTable()


@pytest.fixture(scope="session")
def fault_bundle(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from airflow_provider_dlq.bundle import build_bundle

    return build_bundle(tmp_path_factory.mktemp("fault-bundle"))


@pytest.fixture(autouse=True, scope="module")
def _close_clients_after_module() -> Iterator[None]:
    yield
    from spark_apps.dlq_replay.pulsar_io import conf

    conf.close_own_clients()
