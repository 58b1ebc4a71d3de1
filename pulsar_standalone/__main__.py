"""``python -m pulsar_standalone start|stop|status|classpath``: Apache Pulsar standalone from a shell.

``start`` runs the broker in the background (data in ``--data-dir``, default ``.pulsar-standalone``)
and prints its URLs, start time and memory; ``stop`` stops exactly that process (by the PID recorded in
the data dir) and deletes the data unless ``--keep-data``; ``classpath`` resolves the jars from Maven
Central into the cache once (later starts are offline). ``--version`` picks the Apache Pulsar release
(default the 4.0 LTS one); ``classpath --all`` resolves every version the test suite runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

from pulsar_standalone.broker import jvm_tmp_dir, start_standalone
from pulsar_standalone.classpath import cache_root, resolve_classpath
from pulsar_standalone.errors import StandaloneError
from pulsar_standalone.java import find_java
from pulsar_standalone.versions import PULSAR_VERSION, TESTED_VERSIONS

STATE_FILE = "standalone.json"


def _overrides(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise StandaloneError(f"--set takes key=value (a standalone.conf key); got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def _cmd_start(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir).absolute()
    state = data_dir / STATE_FILE
    if state.exists():
        pid = json.loads(state.read_text())["pid"]
        if _alive(pid):
            print(f"already running (pid {pid}); `python -m pulsar_standalone stop` first", file=sys.stderr)
            return 1
    broker = start_standalone(
        data_dir,
        conf_overrides=_overrides(args.set),
        namespaces=args.namespace,
        heap=args.heap,
        direct_memory=args.direct_memory,
        die_with_parent=False,
        version=args.version,
    )
    record = {
        "pid": broker.pid,
        "service_url": broker.service_url,
        "admin_url": broker.admin_url,
        "metrics_url": broker.metrics_url,
        "version": broker.version,
        "started_in_s": round(broker.started_in_s, 2),
        "classpath_resolved_in_s": broker.classpath_resolved_in_s,
    }
    state.write_text(json.dumps(record, indent=2))
    print(broker.describe(), file=sys.stderr)
    print(json.dumps(record))
    broker._close_log()  # the JVM keeps writing its own handle
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _cmd_stop(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir).absolute()
    state = data_dir / STATE_FILE
    if not state.exists():
        print(f"no broker recorded in {data_dir} (nothing to stop)", file=sys.stderr)
        return 0
    pid = int(json.loads(state.read_text())["pid"])
    if _alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + args.timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    print(f"stopped pid {pid}", file=sys.stderr)
    if args.keep_data:
        state.unlink()
        shutil.rmtree(jvm_tmp_dir(data_dir), ignore_errors=True)  # the JVM's unpacked natives, not data
    else:
        shutil.rmtree(data_dir, ignore_errors=True)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    state = Path(args.data_dir).absolute() / STATE_FILE
    if not state.exists():
        print("not running")
        return 3
    record = json.loads(state.read_text())
    record["running"] = _alive(int(record["pid"]))
    print(json.dumps(record))
    return 0 if record["running"] else 3


def _cmd_classpath(args: argparse.Namespace) -> int:
    java, major, source = find_java()
    for version in TESTED_VERSIONS if args.all else (args.version,):
        started = time.monotonic()
        classpath = resolve_classpath(version)
        fetched = "from the cache (offline)" if classpath.resolved_in_s is None else "from Maven Central"
        print(
            f"Apache Pulsar {version}: {len(classpath.jars)} jars {fetched} in "
            f"{time.monotonic() - started:.1f} s, cache {cache_root()}; Java {major} from {source} ({java})",
            file=sys.stderr,
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pulsar_standalone", allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    default_dir = os.environ.get("PULSAR_STANDALONE_DATA_DIR", ".pulsar-standalone")
    start = sub.add_parser("start", help="start a broker in the background", allow_abbrev=False)
    start.add_argument("--data-dir", default=default_dir)
    start.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="standalone.conf key")
    start.add_argument("--namespace", action="append", default=[], metavar="TENANT/NS", help="create it")
    start.add_argument("--heap", help="JVM heap, e.g. 512m (env PULSAR_STANDALONE_HEAP)")
    start.add_argument("--direct-memory", help="JVM direct memory, e.g. 512m")
    start.add_argument(
        "--version", default=PULSAR_VERSION, help=f"Apache Pulsar release (default {PULSAR_VERSION})"
    )
    stop = sub.add_parser("stop", help="stop the broker started with --data-dir", allow_abbrev=False)
    stop.add_argument("--data-dir", default=default_dir)
    stop.add_argument("--keep-data", action="store_true")
    stop.add_argument("--timeout", type=float, default=20.0)
    status = sub.add_parser("status", help="print the running broker's URLs", allow_abbrev=False)
    status.add_argument("--data-dir", default=default_dir)
    classpath = sub.add_parser(
        "classpath", help="fetch the jars once (Maven Central) and check Java", allow_abbrev=False
    )
    classpath.add_argument(
        "--version", default=PULSAR_VERSION, help=f"Apache Pulsar release (default {PULSAR_VERSION})"
    )
    classpath.add_argument(
        "--all", action="store_true", help=f"every version the tests run: {', '.join(TESTED_VERSIONS)}"
    )
    args = parser.parse_args(argv)
    handlers = {"start": _cmd_start, "stop": _cmd_stop, "status": _cmd_status, "classpath": _cmd_classpath}
    try:
        return handlers[args.command](args)
    except StandaloneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
