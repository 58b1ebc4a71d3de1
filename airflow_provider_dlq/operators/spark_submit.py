"""The one adapter touching ``SparkSubmitHook``'s private members (connection, process, output, driver wait);
``tests/unit/provider/test_spark_submit_contract.py`` checks each against the installed Spark provider."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk.exceptions import AirflowException

from airflow_provider_dlq.errors import DlqProviderError
from pulsar_dlq_consumer.replay_options import SUMMARY_PREFIX

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

#: Driver states of a standalone master: ended (the hook's own list), and reattached to by a next try
#: (``UNKNOWN`` is a master recovering, the driver may still run).
DRIVER_ENDED = frozenset({"FINISHED", "UNKNOWN", "KILLED", "FAILED", "ERROR"})
DRIVER_ACTIVE = frozenset({"SUBMITTED", "RUNNING", "RELAUNCHING", "UNKNOWN"})
#: The task state store key of a standalone cluster driver's id (``SparkSubmitOperator.external_id_key``).
DRIVER_ID_KEY = "spark_job_id"


class SparkDriverError(DlqProviderError, AirflowException):
    """The driver of a standalone cluster deploy-mode run ended other than ``FINISHED``."""


@dataclass(frozen=True)
class SparkTarget:
    """Where spark-submit sends the app, as ``SparkSubmitHook`` resolves the Spark connection."""

    master: str
    deploy_mode: str | None

    @property
    def env_goes_on_argv(self) -> bool:
        """spark-submit puts its environment on its command line (YARN, Kubernetes, cluster mode)."""
        return "yarn" in self.master or "k8s" in self.master or self.deploy_mode == "cluster"


def spark_target(conn_id: str, deploy_mode: str | None = None) -> SparkTarget:
    return ReplaySubmitHook(conn_id=conn_id, deploy_mode=deploy_mode).target


class ReplaySubmitHook(SparkSubmitHook):
    """``SparkSubmitHook`` whose :meth:`run` returns when the app has ended, in every deploy mode and
    Spark provider version; :attr:`summary_line` is the app's last ``DLQ_REPLAY_SUMMARY`` line."""

    summary_line: str | None = None

    @property
    def target(self) -> SparkTarget:
        return SparkTarget(str(self._connection["master"]), self._connection.get("deploy_mode"))

    @property
    def process(self) -> subprocess.Popen[str] | None:
        return self._submit_sp

    def _process_spark_submit_log(self, itr: Iterator[Any]) -> None:
        def tee() -> Iterator[Any]:
            for line in itr:
                if isinstance(line, str) and line.strip().startswith(SUMMARY_PREFIX):
                    self.summary_line = line.strip()
                yield line

        super()._process_spark_submit_log(tee())

    @property
    def tracks_driver(self) -> bool:
        """True in standalone cluster deploy mode: the driver runs on the cluster, known by its id."""
        return bool(self._should_track_driver_status)

    def run(self, application: str, on_submitted: Callable[[str], None] | None = None) -> None:
        """spark-submit ``application``, then (standalone cluster mode, Spark provider 6.1+) poll the driver
        until it ends, as ``submit()`` did up to 6.0; ``on_submitted`` gets the driver's id first."""
        self.submit(application)
        if not self._should_track_driver_status or self._driver_status in DRIVER_ENDED:
            return
        if on_submitted is not None and self._driver_id:
            on_submitted(self._driver_id)
        self._track_driver()

    def driver_state(self, driver_id: str) -> str | None:
        """One look at the state of standalone cluster driver ``driver_id`` (``None``: unknown)."""
        self._driver_id = driver_id
        self._driver_status = None
        status = subprocess.run(
            self._build_track_driver_status_command(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._process_spark_status_log(iter(status.stdout.splitlines()))
        return str(self._driver_status) if self._driver_status else None

    def reattach(self, driver_id: str) -> None:
        """Poll an earlier try's running driver until it ends; :class:`SparkDriverError` unless FINISHED."""
        self._driver_id = driver_id
        self._track_driver()

    def _track_driver(self) -> None:
        self._driver_status = "SUBMITTED"  # the hook's poll loop stops at once on UNKNOWN
        try:
            self._start_driver_status_tracking()
        finally:
            # 6.x defers the hook's post-submit commands to whoever waits for the driver.
            if (post_submit := getattr(self, "_run_post_submit_commands", None)) is not None:
                post_submit()
        if self._driver_status != "FINISHED":
            raise SparkDriverError(
                f"Spark driver {self._driver_id} on {self.target.master} ended with status "
                f"{self._driver_status}, not FINISHED; its log is on the Spark master's UI (Completed "
                "Drivers). A retry of the task resumes the same replay run."
            )
