"""Where this project's runs execute: one small function per contender, from its name to a Spark master.

``ours`` and ``ours_local1`` submit to ``local[2]`` (or ``--master``) and ``local[1]``; ``ours_cluster``
to a Spark standalone cluster of one master and two workers of one core each; ``ours_connect`` with
``--remote`` to a Spark Connect server on ``local[2]``. A cluster or a Connect server is started fresh
before each such run and is not timed; it is stopped by PID when the run has been verified. Their
processes belong to the run's memory: a cluster's executors (children of its workers, ``adopted_parents``)
and the Connect server with its Python workers (``adopted_roots``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOG = logging.getLogger("bench")

#: The Connect server's own master: the same as ``ours``.
CONNECT_MASTER = "local[2]"


@dataclass(frozen=True)
class SparkTarget:
    """What spark-submit is pointed at: a ``master``, or a Spark Connect URL (``sc://...``) for
    ``--remote``, and the long-lived processes whose memory counts in the run's."""

    master: str
    adopted_parents: tuple[int, ...] = ()
    adopted_roots: tuple[int, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def remote(self) -> bool:
        return is_remote(self.master)


def is_remote(master: str) -> bool:
    """Whether ``master`` is a Spark Connect URL (submitted with ``--remote``)."""
    return master.startswith("sc://")


@dataclass(frozen=True)
class Where:
    """What a target needs: ``master`` (``--master`` of ``ours``), the environment its servers get (an S3
    server's keys and endpoint), a folder for their logs and a scratch folder of the run."""

    master: str
    env: dict[str, str]
    log_dir: Path
    workdir: Path


def _local(master: str) -> Callable[[Where], contextlib.AbstractContextManager[SparkTarget]]:
    @contextlib.contextmanager
    def start(where: Where) -> Iterator[SparkTarget]:
        yield SparkTarget(master or where.master)

    return start


@contextlib.contextmanager
def _cluster(where: Where) -> Iterator[SparkTarget]:
    from spark_standalone import SparkCluster

    with SparkCluster(log_dir=where.log_dir, env=dict(where.env)) as cluster:
        cluster.start(workers=2, cores=1, memory="2g")
        LOG.info("Spark standalone cluster at %s (2 workers x 1 core)", cluster.master_url)
        yield SparkTarget(cluster.master_url, adopted_parents=tuple(cluster.worker_pids()))


def connect_server_conf(workdir: Path) -> tuple[dict[str, str], dict[str, str]]:
    """``(Spark settings, environment)`` of the Connect server: the driver settings and malloc arenas the
    operator gives a ``local[2]`` driver (:mod:`airflow_provider_dlq.driver_footprint`), so that the Connect
    run differs from ``ours`` by Spark Connect alone; the JVM's temp dir in the run's scratch folder."""
    from airflow_provider_dlq.class_data import DRIVER_JAVA_OPTIONS
    from airflow_provider_dlq.driver_footprint import lean_driver_conf, lean_driver_env

    tmp = workdir / "connect-jvm-tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    conf = lean_driver_conf({DRIVER_JAVA_OPTIONS: f"-Djava.io.tmpdir={tmp}"}, CONNECT_MASTER)
    return conf, lean_driver_env({}, CONNECT_MASTER)


@contextlib.contextmanager
def _connect(where: Where) -> Iterator[SparkTarget]:
    from spark_standalone import ConnectServer

    conf, env = connect_server_conf(where.workdir)
    with ConnectServer(log_dir=where.log_dir) as server:
        url = server.start(master=CONNECT_MASTER, env={**env, **where.env}, conf=conf)
        assert server.pid is not None
        LOG.info("Spark Connect server at %s on %s (up in %.1f s)", url, CONNECT_MASTER, server.started_in_s)
        details = {"connect_server_master": CONNECT_MASTER, "connect_server_conf": conf}
        yield SparkTarget(url, adopted_roots=(server.pid,), details=details)


#: How each of this project's contenders reaches Spark (``""``: the ``--master`` option).
TARGETS: dict[str, Callable[[Where], contextlib.AbstractContextManager[SparkTarget]]] = {
    "ours": _local(""),
    "ours_local1": _local("local[1]"),
    "ours_cluster": _cluster,
    "ours_connect": _connect,
}


def spark_target(contender: str, where: Where) -> contextlib.AbstractContextManager[SparkTarget]:
    """The Spark target of ``contender``, its servers (if any) running while the block lasts."""
    return TARGETS[contender](where)
