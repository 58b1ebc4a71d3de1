"""``python -m spark_standalone [cluster|connect|s3] [options]``: start one server on loopback, print how to
reach it, stop it (by PID, temp dir removed) on Ctrl-C or SIGTERM.

- ``cluster`` (the default) ``[--workers N] [--cores C] [--memory M]``: a Spark standalone cluster.
- ``connect [--master M] [--s3]``: a Spark Connect server; ``--s3`` also starts an S3 server and gives its
  keys and endpoint to the Connect server (its tasks can then write ``s3://`` paths).
- ``s3``: moto's S3 server; prints the environment a client needs.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time

from spark_standalone.cluster import SparkCluster
from spark_standalone.connect import ConnectServer
from spark_standalone.s3 import S3Server


def _wait() -> None:
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            time.sleep(3600)


def _print_env(env: dict[str, str]) -> None:
    for key, value in env.items():
        print(f"  export {key}={value}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spark_standalone",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("what", nargs="?", choices=("cluster", "connect", "s3"), default="cluster")
    parser.add_argument("--workers", type=int, default=2, help="cluster: number of workers (default 2)")
    parser.add_argument("--cores", type=int, default=1, help="cluster: cores per worker (default 1)")
    parser.add_argument("--memory", default="1g", help="cluster: executor memory per worker (default 1g)")
    parser.add_argument("--master", default="local[2]", help="connect: its master (default local[2])")
    parser.add_argument("--s3", action="store_true", help="connect: with an S3 server for its tasks")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # runs the finally blocks below
    with contextlib.ExitStack() as stack:
        if args.what == "cluster":
            cluster = stack.enter_context(SparkCluster())
            master = cluster.start(workers=args.workers, cores=args.cores, memory=args.memory)
            print(f"master {master} (UI {cluster.webui_url}); workers {cluster.worker_pids()}")
            print("Ctrl-C stops it")
        elif args.what == "s3":
            s3 = stack.enter_context(S3Server())
            print(f"S3 server {s3.start()} (pid {s3.process.pid if s3.process else '-'}); Ctrl-C stops it")
            print("a client's environment:")
            _print_env(s3.env)
        else:
            env: dict[str, str] = {}
            if args.s3:
                s3 = stack.enter_context(S3Server())
                print(f"S3 server {s3.start()}; the Connect server's tasks have its keys. A client needs:")
                _print_env(s3.env)
                env = s3.env
            server = stack.enter_context(ConnectServer())
            url = server.start(master=args.master, env=env, ui=True)
            print(
                f"Spark Connect server {url} on {args.master} (UI {server.webui_url}, pid {server.pid}), "
                f"ready in {server.started_in_s:.0f} s; Ctrl-C stops it"
            )
            print(f"  spark-submit --remote {url} app.py   |   SparkSession.builder.remote('{url}')")
        sys.stdout.flush()
        _wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
