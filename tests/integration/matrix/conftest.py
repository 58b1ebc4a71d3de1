"""Fixtures of the broker matrix: the results table (written into the build folder as rows are
recorded, see ``matrix_support.table_file``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from matrix_support import CASES, MatrixRow, merge_into_doc


class MatrixTable:
    """Rows recorded by the matrix tests of this session."""

    def __init__(self) -> None:
        self.rows: list[MatrixRow] = []

    def record(self, row: MatrixRow) -> None:
        assert row.case in CASES, f"declare case {row.case!r} in matrix_support.CASES"
        self.rows.append(row)
        merge_into_doc([row])  # at once: a session cut short keeps the rows of the cases it finished


@pytest.fixture(scope="session")
def matrix_table() -> MatrixTable:
    return MatrixTable()


@pytest.fixture(autouse=True, scope="module")
def _close_clients_after_module() -> Iterator[None]:
    yield
    from spark_apps.dlq_replay.pulsar_io import conf

    conf.close_own_clients()
