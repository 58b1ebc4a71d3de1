"""The replay allocates Arrow buffers from jemalloc, which hands a freed batch back to the system."""

from __future__ import annotations

import subprocess
import sys
import textwrap

_SCRIPT = textwrap.dedent(
    """
    import time
    import pyarrow as pa
    from spark_apps.dlq_replay.arrow_util import use_jemalloc_pool

    def rss_mib():
        return int(open("/proc/self/statm").read().split()[1]) * 4096 >> 20

    use_jemalloc_pool()
    print(pa.default_memory_pool().backend_name)
    rows = [bytes(1000)] * 2000
    batches = [pa.array(rows, pa.binary()) for _ in range(100)]  # 200 MB of payloads
    peak = rss_mib()
    del batches
    deadline = time.monotonic() + 10
    while rss_mib() > peak - 100 and time.monotonic() < deadline:
        pa.array(rows[:10], pa.binary())  # the pool's own activity lets it return what decayed
        time.sleep(0.2)
    print(peak - rss_mib())
    """
)


def test_a_freed_batch_goes_back_to_the_system_within_seconds():
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, check=True).stdout
    backend, returned_mib = out.split()
    assert backend == "jemalloc"
    assert int(returned_mib) >= 100


def test_a_pyarrow_without_jemalloc_keeps_its_pool_and_says_so_once(monkeypatch, caplog):
    import pyarrow as pa

    from spark_apps.dlq_replay import arrow_util

    def missing():
        raise pa.ArrowNotImplementedError("This Arrow build does not enable jemalloc")

    monkeypatch.setattr(pa, "jemalloc_memory_pool", missing)
    arrow_util._warn_no_jemalloc.cache_clear()
    before = pa.default_memory_pool().backend_name
    with caplog.at_level("WARNING", logger="spark_apps.dlq_replay"):
        arrow_util.use_jemalloc_pool()
        arrow_util.use_jemalloc_pool()
    assert pa.default_memory_pool().backend_name == before
    warnings = [r.getMessage() for r in caplog.records if "without jemalloc" in r.getMessage()]
    assert len(warnings) == 1
    assert "install pyarrow's wheel from PyPI" in warnings[0]
    arrow_util._warn_no_jemalloc.cache_clear()
