"""Benchmark harness: replay throughput against the copy ceiling and hand-written baselines.

Run ``python -m bench --help``; see ``docs/benchmarks.md``.
"""

from __future__ import annotations
