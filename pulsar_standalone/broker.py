"""Start and stop Apache Pulsar standalone on loopback: free ports, private data dir, stopped by PID.

:func:`start_standalone` writes a per-instance copy of ``conf/standalone.conf`` with free loopback
ports (binary protocol, admin REST, bookie), starts ``PulsarStandaloneStarter`` on Java 21+ with the
cached Maven classpath, and returns once admin REST answers and ``public/default`` exists.
:meth:`StandaloneBroker.stop` stops exactly that JVM (SIGTERM, then SIGKILL) and deletes a data dir it
created. :meth:`StandaloneBroker.kill` and :meth:`StandaloneBroker.restart` let fault tests kill the
broker and bring it back on the same ports and data.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

from pulsar_standalone.admin import AdminClient
from pulsar_standalone.classpath import PACKAGE_DIR, resolve_classpath
from pulsar_standalone.errors import StandaloneError
from pulsar_standalone.java import find_java
from pulsar_standalone.versions import PULSAR_VERSION

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

log = logging.getLogger(__name__)
CONF_TEMPLATE = PACKAGE_DIR / "conf" / "standalone.conf"
LOG_CONFIG = PACKAGE_DIR / "conf" / "log4j2.yaml"
DEFAULT_HEAP = "512m"
DEFAULT_DIRECT_MEMORY = "512m"
DEFAULT_START_TIMEOUT_S = 180.0

#: The bookie stops taking writes (turns read-only) when less than this is free on its data dir's disk,
#: and warns below :data:`BOOKIE_WARN_FREE_BYTES`. BookKeeper takes these limits as fractions of the
#: disk (``diskUsageThreshold``), so the launcher works them out per disk: a fixed 0.99 leaves 2.5 GB
#: unused on a 250 GB disk, and the broker then fails every write with "Not enough non-faulty bookies".
BOOKIE_MIN_FREE_BYTES = 256 * 2**20
BOOKIE_WARN_FREE_BYTES = 2**30
_MAX_DISK_FRACTION = 0.9999  # BookKeeper requires a threshold below 1

#: Flags the distribution's ``bin/pulsar`` passes to the JVM (module opens for BookKeeper and Netty,
#: and the metadata drivers that let the bookie keep its metadata in the broker's RocksDB store).
_JVM_FLAGS = (
    "-Djava.net.preferIPv4Stack=true",
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-Dio.netty.leakDetectionLevel=disabled",
    "-Dpulsar.allocator.exit_on_oom=true",
    "-Dlog4j.shutdownHookEnabled=false",
    "-Dlog4j2.is.webapp=false",
    "-Dbookkeeper.metadata.bookie.drivers=org.apache.pulsar.metadata.bookkeeper.PulsarMetadataBookieDriver",
    "-Dbookkeeper.metadata.client.drivers=org.apache.pulsar.metadata.bookkeeper.PulsarMetadataClientDriver",
    "--add-opens=java.base/java.io=ALL-UNNAMED",
    "--add-opens=java.base/java.util.zip=ALL-UNNAMED",
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-opens=java.base/sun.net=ALL-UNNAMED",
    "--add-opens=java.management/sun.management=ALL-UNNAMED",
    "-XX:+ExitOnOutOfMemoryError",
)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def read_conf(path: Path) -> dict[str, str]:
    """``key=value`` lines of a Pulsar/BookKeeper properties file, in order (comments dropped)."""
    conf: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", "!")) or "=" not in line:
            continue
        key, _, value = line.partition("=")
        conf[key.strip()] = value.strip()
    return conf


def write_conf(path: Path, conf: Mapping[str, str]) -> None:
    """Write ``conf`` once per key (BookKeeper reads a repeated key as a list, so never append)."""
    path.write_text("".join(f"{k}={v}\n" for k, v in conf.items()))


def kill_when_parent_dies() -> None:  # pragma: no cover - runs in the forked child
    """``preexec_fn`` for a child process (broker, Spark daemon, Airflow server): ask the kernel to
    SIGKILL it if the process that started it dies (Linux; elsewhere a no-op)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


#: Starts tried by :meth:`StandaloneBroker.restart` while the bookie registration loops.
RESTART_ATTEMPTS = 3
_REGISTRATION_LOOP = re.compile(r"Lock on resource /ledgers/available/\S+ was invalidated")


def disk_thresholds(directory: Path) -> dict[str, str]:
    """BookKeeper's disk thresholds for ``directory``'s disk: read-only below :data:`BOOKIE_MIN_FREE_BYTES`.

    Raises :class:`StandaloneError` when the disk has less than that free already: the bookie would start
    read-only and the broker would fail every write.
    """
    usage = shutil.disk_usage(directory)
    if usage.free < BOOKIE_MIN_FREE_BYTES:
        raise StandaloneError(
            f"only {usage.free / 2**20:.0f} MiB are free on the disk of {directory}; Apache Pulsar's bookie "
            f"needs at least {BOOKIE_MIN_FREE_BYTES / 2**20:.0f} MiB to take writes. Free disk space, or "
            f"put the broker's data on a disk with room (start_standalone(data_dir=...), or "
            f"--data-dir of python -m pulsar_standalone start)"
        )
    full = min(_MAX_DISK_FRACTION, 1 - BOOKIE_MIN_FREE_BYTES / usage.total)
    warn = min(full, max(0.01, 1 - BOOKIE_WARN_FREE_BYTES / usage.total))
    return {"diskUsageThreshold": f"{full:.6f}", "diskUsageWarnThreshold": f"{warn:.6f}"}


_DISK_FULL = re.compile(r"DiskChecker - Space left on device .* > threshold .*")  # not "> WarnThreshold"


def bookie_disk_full(broker_log: str) -> str | None:
    """The last line of a broker log where the bookie found its disk full (and turned read-only), if any."""
    found = _DISK_FULL.findall(broker_log)
    return found[-1] if found else None


def bookie_registration_loops(broker_log: str) -> bool:
    """Whether a broker log shows the bookie's registration lock invalidated after it was taken.

    The bookie's lock value never compares equal to itself once read back, so every invalidation deletes
    and re-creates the registration, which invalidates it again: one such line means the loop has begun
    (logged at info by ``ResourceLockImpl``, raised to info in ``conf/log4j2.yaml``).
    """
    return _REGISTRATION_LOOP.search(broker_log) is not None


def jvm_tmp_dir(data_dir: Path) -> Path:
    """The broker JVM's ``java.io.tmpdir`` in ``data_dir``: RocksDB, Netty and the codecs unpack their
    native libraries there, and a killed JVM leaves them behind."""
    return data_dir / "tmp"


@dataclass
class StandaloneBroker:
    """A running Apache Pulsar standalone started by :func:`start_standalone`."""

    service_url: str
    admin_url: str
    data_dir: Path
    conf: dict[str, str]
    java: Path
    java_major: int
    bookie_port: int
    started_in_s: float
    classpath_resolved_in_s: float | None
    owns_data_dir: bool
    heap: str = DEFAULT_HEAP
    direct_memory: str = DEFAULT_DIRECT_MEMORY
    die_with_parent: bool = True
    admin_token: str | None = field(default=None, repr=False)
    tls_trust_certs_file: str | None = None
    version: str = PULSAR_VERSION
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _log: IO[bytes] | None = field(default=None, repr=False)

    # ----------------------------------------------------------------- what tests and users read
    @property
    def pid(self) -> int:
        return self._process.pid if self._process is not None else -1

    @property
    def metrics_url(self) -> str:
        """Prometheus metrics (``pulsar_subscription_back_log`` and friends)."""
        return f"{self.admin_url}/metrics/"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "broker.log"

    @property
    def conf_path(self) -> Path:
        return self.data_dir / "standalone.conf"

    def admin(self) -> AdminClient:
        """An admin REST client with the superuser token and trust file the broker was started with."""
        return AdminClient(
            self.admin_url, token=self.admin_token, tls_trust_certs_file=self.tls_trust_certs_file
        )

    def rss_bytes(self) -> int | None:
        """Resident memory of the broker JVM now."""
        return _rss_bytes(self.pid) if self.alive() else None

    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def describe(self) -> str:
        rss = self.rss_bytes()
        fetched = (
            f"Maven fetch {self.classpath_resolved_in_s:.1f} s + "
            if self.classpath_resolved_in_s is not None
            else ""
        )
        return (
            f"Apache Pulsar {self.version} standalone on Java {self.java_major} ({self.java}): "
            f"{self.service_url}, admin {self.admin_url}, pid {self.pid}, "
            f"started in {fetched}{self.started_in_s:.1f} s, RSS {rss / 2**20 if rss else 0:.0f} MiB"
        )

    def disk_full(self) -> str | None:
        """Where the broker log says the bookie found its disk full, if it did (:func:`bookie_disk_full`)."""
        return bookie_disk_full(self._log_since(0))

    def tail_log(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no broker log)"

    # ----------------------------------------------------------------- life cycle
    @property
    def tmp_dir(self) -> Path:
        """The JVM's ``java.io.tmpdir`` (:func:`jvm_tmp_dir`); :meth:`stop` removes it with the broker."""
        return jvm_tmp_dir(self.data_dir)

    def _launch(self, *, wipe: bool) -> None:
        classpath = resolve_classpath(self.version, offline_only=True)
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            str(self.java),
            f"-Xms{self.heap}",
            f"-Xmx{self.heap}",
            f"-XX:MaxDirectMemorySize={self.direct_memory}",
            f"-Djava.io.tmpdir={self.tmp_dir}",
            f"-Dlog4j.configurationFile={LOG_CONFIG}",
            f"-Dpulsar.log.level={os.environ.get('PULSAR_STANDALONE_LOG_LEVEL', 'warn')}",
            *_JVM_FLAGS,
            *shlex.split(os.environ.get("PULSAR_EXTRA_OPTS", "")),
            "-cp",
            str(classpath),
            "org.apache.pulsar.PulsarStandaloneStarter",
            "--config",
            str(self.conf_path),
            "--no-functions-worker",
            "--no-stream-storage",
            "--bookkeeper-port",
            str(self.bookie_port),
            "--metadata-dir",
            str(self.data_dir / "metadata"),
            "--bookkeeper-dir",
            str(self.data_dir / "bookkeeper"),
        ]
        if wipe:
            cmd.append("--wipe-data")
        self._log = self.log_path.open("ab")
        env = {k: v for k, v in os.environ.items() if k not in ("JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS")}
        env["JAVA_HOME"] = str(self.java.parent.parent)
        self._process = subprocess.Popen(
            cmd,
            cwd=self.data_dir,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=kill_when_parent_dies if self.die_with_parent else None,
        )

    def _wait_ready(self, timeout_s: float) -> None:
        admin = self.admin()
        deadline = time.monotonic() + timeout_s
        last_error = "no answer yet"
        while time.monotonic() < deadline:
            if not self.alive():
                code = self._process.returncode if self._process is not None else None
                raise StandaloneError(
                    f"Apache Pulsar exited with code {code} while starting; its log ({self.log_path}) ends:\n"
                    f"{self.tail_log()}"
                )
            try:
                # Admin REST answers before the standalone has created its cluster and namespace.
                if "public/default" in (admin.get("/admin/v2/namespaces/public", timeout=2) or []):
                    return
            except (OSError, urllib.error.URLError, ValueError) as exc:
                last_error = str(exc)
            time.sleep(0.25)
        raise StandaloneError(
            f"Apache Pulsar did not answer on {self.admin_url} within {timeout_s:.0f} s ({last_error}); "
            f"its log ({self.log_path}) ends:\n{self.tail_log()}"
        )

    def kill(self) -> None:
        """SIGKILL the broker and keep its data (fault tests); :meth:`restart` brings it back."""
        if self.alive() and self._process is not None:
            self._process.kill()
            self._process.wait(timeout=30)
        self._close_log()

    def restart(self, timeout_s: float = DEFAULT_START_TIMEOUT_S) -> None:
        """Start the broker again on the same ports and data (after :meth:`kill` or :meth:`stop`).

        After a crash the bookie's registration from the killed JVM is still in the metadata store. In
        Apache Pulsar 4.0 standalone, removing that stale entry can set the new bookie's registration
        lock re-creating itself in a loop, and the broker then fails ledger operations with "Not enough
        non-faulty bookies" for as long as it runs. Such a start is stopped cleanly (which removes the
        registration) and the broker is started again, up to :data:`RESTART_ATTEMPTS` times.
        """
        if self.alive():
            raise StandaloneError(f"the broker (pid {self.pid}) is still running; kill() or stop() it first")
        if not self.data_dir.is_dir():
            raise StandaloneError(f"the data dir {self.data_dir} is gone; start a new broker instead")
        started = time.monotonic()
        for attempt in range(1, RESTART_ATTEMPTS + 1):
            log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
            self._launch(wipe=False)
            try:
                self._wait_ready(max(1.0, timeout_s - (time.monotonic() - started)))
            except BaseException:
                self.stop(remove_data=False)
                raise
            if not bookie_registration_loops(self._log_since(log_start)):
                self.started_in_s = time.monotonic() - started
                return
            self.stop(remove_data=False)
            if attempt < RESTART_ATTEMPTS:
                log.warning(
                    "Apache Pulsar restarted with its bookie registration in a loop (attempt %d); "
                    "stopped it cleanly and starting it again",
                    attempt,
                )
        raise StandaloneError(
            f"Apache Pulsar restarted {RESTART_ATTEMPTS} times with its bookie registration re-creating "
            f"itself in a loop (see {self.log_path}); start a new broker on a fresh data dir"
        )

    def _log_since(self, offset: int) -> str:
        try:
            with self.log_path.open("rb") as log_file:
                log_file.seek(offset)
                return log_file.read().decode(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout_s: float = 20.0, *, remove_data: bool | None = None) -> None:
        """Stop exactly this broker (SIGTERM, then SIGKILL) and delete a data dir it created. Idempotent."""
        process = self._process
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                process.wait(timeout=30)
        self._close_log()
        if self.owns_data_dir if remove_data is None else remove_data:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        else:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)  # the broker's unpacked natives, not its data

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> StandaloneBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_standalone(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    conf_overrides: Mapping[str, object] | None = None,
    namespaces: Iterable[str] = (),
    heap: str | None = None,
    direct_memory: str | None = None,
    timeout_s: float = DEFAULT_START_TIMEOUT_S,
    die_with_parent: bool = True,
    admin_token: str | None = None,
    tls_trust_certs_file: str | None = None,
    version: str = PULSAR_VERSION,
) -> StandaloneBroker:
    """Start Apache Pulsar standalone on free loopback ports and wait until admin REST answers.

    ``version`` is the Apache Pulsar release to run (default :data:`~pulsar_standalone.PULSAR_VERSION`;
    the tests also run :data:`~pulsar_standalone.PULSAR_NEWEST_VERSION`); its jars are resolved from Maven
    Central on first use.
    ``data_dir`` None: a private temp dir, deleted by :meth:`StandaloneBroker.stop`; a given dir is kept.
    ``conf_overrides`` replace keys of ``conf/standalone.conf`` (e.g. TLS and authentication settings).
    ``namespaces`` (``tenant/ns``) are created once the broker is up. With authentication or TLS-only
    ports in the overrides, give ``admin_token`` (a superuser's) and ``tls_trust_certs_file`` for admin
    REST. Memory: ``heap`` and ``direct_memory`` (JVM sizes such as ``512m``), or the env vars
    ``PULSAR_STANDALONE_HEAP`` and ``PULSAR_STANDALONE_DIRECT_MEMORY``; more JVM options in
    ``PULSAR_EXTRA_OPTS``, as for the distribution's ``bin/pulsar``. ``die_with_parent`` kills the
    broker when the calling process dies.

    A free port can be taken by another process between the moment it is picked and the moment the
    broker binds it: a start that fails to bind is retried on new ports (up to :data:`BIND_ATTEMPTS`).
    """
    for attempt in range(1, BIND_ATTEMPTS + 1):
        try:
            return _start_once(
                data_dir,
                conf_overrides=conf_overrides,
                namespaces=namespaces,
                heap=heap,
                direct_memory=direct_memory,
                timeout_s=timeout_s,
                die_with_parent=die_with_parent,
                admin_token=admin_token,
                tls_trust_certs_file=tls_trust_certs_file,
                version=version,
            )
        except StandaloneError as exc:
            if attempt == BIND_ATTEMPTS or not any(m in str(exc) for m in _BIND_FAILURES):
                raise
            log.warning("Apache Pulsar could not bind a port picked as free (attempt %d); new ports", attempt)
    raise AssertionError("unreachable")


#: Starts tried when the broker fails to bind a port that was free when picked.
BIND_ATTEMPTS = 3
_BIND_FAILURES = ("Failed to bind", "Address already in use", "BindException")


def _start_once(
    data_dir: str | os.PathLike[str] | None,
    *,
    conf_overrides: Mapping[str, object] | None,
    namespaces: Iterable[str],
    heap: str | None,
    direct_memory: str | None,
    timeout_s: float,
    die_with_parent: bool,
    admin_token: str | None,
    tls_trust_certs_file: str | None,
    version: str = PULSAR_VERSION,
) -> StandaloneBroker:
    classpath = resolve_classpath(version=version)
    java, major, _ = find_java()
    owns = data_dir is None
    directory = Path(tempfile.mkdtemp(prefix="pulsar-standalone-") if owns else data_dir).absolute()  # type: ignore[arg-type]
    directory.mkdir(parents=True, exist_ok=True)
    conf = read_conf(CONF_TEMPLATE)
    try:
        conf.update(disk_thresholds(directory))
    except StandaloneError:
        if owns:
            shutil.rmtree(directory, ignore_errors=True)
        raise
    conf.update(
        {
            "brokerServicePort": str(free_port()),
            "webServicePort": str(free_port()),
            "bindAddress": "127.0.0.1",
            "advertisedAddress": "127.0.0.1",
        }
    )
    conf.update({str(k): str(v) for k, v in (conf_overrides or {}).items()})
    launch_started = time.monotonic()
    broker = StandaloneBroker(
        service_url=_service_url(conf),
        admin_url=_admin_url(conf),
        data_dir=directory,
        conf=conf,
        java=java,
        java_major=major,
        bookie_port=free_port(),
        started_in_s=0.0,
        classpath_resolved_in_s=classpath.resolved_in_s,
        owns_data_dir=owns,
        heap=heap or os.environ.get("PULSAR_STANDALONE_HEAP") or DEFAULT_HEAP,
        direct_memory=(
            direct_memory or os.environ.get("PULSAR_STANDALONE_DIRECT_MEMORY") or DEFAULT_DIRECT_MEMORY
        ),
        die_with_parent=die_with_parent,
        admin_token=admin_token,
        tls_trust_certs_file=tls_trust_certs_file,
        version=version,
    )
    write_conf(broker.conf_path, conf)
    broker._launch(wipe=True)
    try:
        broker._wait_ready(timeout_s)
        admin = broker.admin()
        for namespace in namespaces:
            admin.create_namespace(namespace, cluster=conf.get("clusterName", "standalone"))
    except BaseException:
        broker.stop()
        raise
    broker.started_in_s = time.monotonic() - launch_started
    return broker


def _service_url(conf: Mapping[str, str]) -> str:
    if conf.get("brokerServicePortTls") and not conf.get("brokerServicePort"):
        return f"pulsar+ssl://127.0.0.1:{conf['brokerServicePortTls']}"
    return f"pulsar://127.0.0.1:{conf['brokerServicePort']}"


def _admin_url(conf: Mapping[str, str]) -> str:
    if conf.get("webServicePortTls") and not conf.get("webServicePort"):
        return f"https://127.0.0.1:{conf['webServicePortTls']}"
    return f"http://127.0.0.1:{conf['webServicePort']}"
