"""Headless Debian Chromium driven by Playwright (Python) for UI tests, with no browser download.

``open_browser()`` yields a Playwright ``Browser`` on ``/usr/bin/chromium`` (or ``CHROMIUM_PATH``) started
with a throwaway profile and the flags a closed network needs; leaving the ``with`` block closes it
(Playwright stops exactly the browser process it launched). Screenshots go to ``screenshot_dir()``:
``DLQ_TEST_SCREENSHOTS`` when set (to keep them), else a temp dir of the test.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM_FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def chromium_path() -> str:
    """The Chromium executable; the error names the fix when it is missing."""
    path = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(path).exists():
        raise RuntimeError(
            "Chromium is needed for the UI tests: `apt-get install chromium` (scripts/test.sh installs it "
            "when it runs as root), or set CHROMIUM_PATH"
        )
    return path


@contextmanager
def open_browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            browser.close()


def screenshot_dir(default: Path) -> Path:
    """Where UI tests save screenshots (``DLQ_TEST_SCREENSHOTS`` to keep them, else ``default``)."""
    target = Path(os.environ.get("DLQ_TEST_SCREENSHOTS") or default)
    target.mkdir(parents=True, exist_ok=True)
    return target
