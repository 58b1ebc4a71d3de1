"""``python -m spark_standalone [--workers N] [--cores C] [--memory M]``: start a cluster on loopback,
print its master URL, stop it (by PID, temp dir removed) on Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import signal
import sys
import time

from spark_standalone.cluster import SparkCluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spark_standalone", description=__doc__, allow_abbrev=False
    )
    parser.add_argument("--workers", type=int, default=2, help="number of workers (default 2)")
    parser.add_argument("--cores", type=int, default=1, help="cores per worker (default 1)")
    parser.add_argument("--memory", default="1g", help="executor memory per worker (default 1g)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # runs the finally below
    with SparkCluster() as cluster:
        master = cluster.start(workers=args.workers, cores=args.cores, memory=args.memory)
        print(f"master {master} (UI {cluster.webui_url}); workers {cluster.worker_pids()}; Ctrl-C stops it")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
