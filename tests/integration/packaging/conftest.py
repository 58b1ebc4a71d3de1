"""Figures of the wheel tests (venv sizes, install times), shown in pytest's terminal summary."""

from __future__ import annotations

from typing import Any

import pytest

FIGURES: list[str] = []


@pytest.fixture
def record_figure() -> Any:
    """``record_figure(text)``: a line for the terminal summary (e.g. a venv size)."""
    return FIGURES.append


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if FIGURES:
        terminalreporter.section("wheel installs")
        for line in FIGURES:
            terminalreporter.write_line(line)
