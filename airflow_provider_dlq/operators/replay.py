"""``DlqReplayOperator``: run the Spark DLQ replay app with spark-submit or as a Spark Connect client."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from datetime import timedelta
from functools import cached_property, partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset, BaseOperator
from airflow.sdk.exceptions import (
    AirflowException,
    AirflowFailException,
    AirflowNotFoundException,
    AirflowSkipException,
)

from airflow_provider_dlq.class_data import ArchivePlan, ClassDataArchive
from airflow_provider_dlq.compiled_pyspark import CompiledCopy, CompiledPySpark
from airflow_provider_dlq.driver_footprint import (
    QuickJit,
    lean_driver_conf,
    lean_driver_env,
    quick_jit_chosen,
    with_quick_jit,
)
from airflow_provider_dlq.hooks.connection import PulsarConnectionError
from airflow_provider_dlq.hooks.pulsar import PulsarHook
from airflow_provider_dlq.operators.links import DlqReplayReportLink, SparkApplicationLink
from airflow_provider_dlq.operators.process_tree import stop_process_tree
from airflow_provider_dlq.operators.reattach import find_holder, wait_for_earlier_attempt
from airflow_provider_dlq.operators.replay_cli import (
    ReplayArgumentError,
    archive_flag,
    build_replay_args,
    check_topics,
    compact_summary,
    default_run_id,
    parse_group_actions,
    report_json,
)
from airflow_provider_dlq.operators.spark_connect import (
    ConnectClient,
    SparkConnectConfigError,
    SparkRemote,
    check_client_installed,
    client_env,
    init_conf,
    spark_remote,
)
from airflow_provider_dlq.operators.spark_submit import (
    DRIVER_ACTIVE,
    DRIVER_ID_KEY,
    ReplaySubmitHook,
    SparkTarget,
    spark_target,
)
from airflow_provider_dlq.output_storage import read_run_report
from airflow_provider_dlq.recipes import APP_CONF
from pulsar_dlq_consumer.replay_options import (
    CONF_EXPECTED_MESSAGES,
    CONF_PAYLOAD_SNIPPETS,
    DEFAULT_CANARY_WAIT_SECONDS,
    DEFAULT_MAX_REPLAYS,
    DEFAULT_SUBSCRIPTION,
    OAUTH2_CREDENTIALS_ENV,
    TOKEN_ENV,
    ReplayOptions,
    ReplayOptionsError,
    check_mode,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from airflow.sdk import Context

    from airflow_provider_dlq.hooks.connection import PulsarConnectionConfig

SECRET_ENVS = (TOKEN_ENV, OAUTH2_CREDENTIALS_ENV)
_USAGE_ERRORS = (
    ReplayArgumentError,
    PulsarConnectionError,
    AirflowNotFoundException,
    SparkConnectConfigError,
)
#: Spark settings the app relies on (user ``conf`` wins); task logs show the app's lines, not Spark's INFO.
DEFAULT_CONF: dict[str, str] = {**APP_CONF, "spark.log.level": "WARN"}


def output_asset(output_dir: str) -> Asset:
    """The asset a replay run updates: its output root."""
    uri = output_dir if "://" in output_dir else Path(output_dir).absolute().as_uri()
    return Asset(name=f"dlq-replay:{uri}", uri=uri)


#: Operator attributes passed to the app's options by name: the templated ones, then numbers and flags.
_TEMPLATED_APP_FIELDS = (
    "topics",
    "output_dir",
    "mode",
    "subscription",
    "playbook",
    "origin_allowlist",
    "signatures",
    "error_class",
    "since",
    "until",
    "max_messages",
    "group_actions",
    "window_from",
    "canary",
    "auth_token_file",
)
_APP_FIELDS = (
    *_TEMPLATED_APP_FIELDS,
    "max_replays",
    "rate_limit",
    "parallelism",
    "archive_payload",
    "canary_wait_seconds",
    "canary_max_failure_rate",
)


def canary_halt_message(summary: Mapping[str, Any]) -> str | None:
    """What to tell the user when the run's canary halted groups (``None`` when it did not)."""
    canary = summary.get("canary") or {}
    halted = list(canary.get("halted") or [])
    if canary.get("verdict") != "halted" or not halted:
        return None
    shown = ", ".join(halted[:5]) + (", ..." if len(halted) > 5 else "")
    return (
        f"Canary halted {len(halted)} error group(s) of replay run {summary.get('run_id')}: {shown}. Their "
        f"canaries failed again in the consumer, so {canary.get('held_back', 0)} message(s) stay pending as "
        "canary_failed; the other groups were replayed in full. Open the task's 'DLQ replay report' link for "
        "the verdict per group and what to do next; after fixing the consumer, trigger a new run."
    )


class DlqReplayOperator(BaseOperator):
    """Replay (or dry-run, or archive) Pulsar DLQ topics with the Spark replay app.

    Returns the summary of the run's ``report.json`` (XCom and every outlet's asset event); a retry
    resumes the same run. Usage errors (bad arguments, a missing connection) fail at once, without retries.

    :param topics: DLQ topics to replay: list or comma-separated string. (templated)
    :param output_dir: Root of ``runs/``, ``archive/`` and ``ledger/``: a path, file://, s3a://... (templated)
    :param mode: ``dry-run`` (default; decide and report only), ``replay`` or ``archive-only``. (templated)
    :param run_id: Replay run id; default ``<dag_id>.<task_id>.<run_id>`` of the DAG run. (templated)
    :param subscription: The replayer's durable subscription (default ``dlq-replayer``). (templated)
    :param playbook: Playbook YAML path readable by the Spark driver; none: skip everything. (templated)
    :param origin_allowlist: Topic globs (or ``re:`` regexes) to republish to; needed to replay. (templated)
    :param signatures: Only act on these error signatures. (templated)
    :param error_class: Only act on this error class. (templated)
    :param since: Only messages published at/after this ISO 8601 time. (templated)
    :param until: Only messages published before this ISO 8601 time. (templated)
    :param max_messages: Act on at most this many messages. (templated)
    :param max_replays: Loop guard; messages replayed this often are archived instead (default 3).
    :param rate_limit: Republished messages per second, at most.
    :param parallelism: Consumers per DLQ partition / producers per origin topic.
    :param archive_payload: Archive payloads (True/"on", default) or only their hash (False/"off").
    :param pulsar_conn_id: The ``pulsar`` connection (service URL, token, TLS trust file).
    :param spark_conn_id: The Spark connection (``spark_default``), or a ``spark_connect`` one (of a server).
    :param auth_token_file: Token file the driver and executors read, instead of a token env. (templated)
    :param oauth2_credentials_file: OAuth2 key file the driver and executors read, not an env. (templated)
    :param storage_conn_id: Connection reading ``report.json`` from an object store (default: environment).
    :param report_url: The *DLQ replay report* link; ``{report_html}`` becomes the report's URI. (templated)
    :param spark_history_url: Spark history server base URL for the *Spark application* link. (templated)
    :param report_payload_snippets: Show masked payload snippets per group in the report (default off).
    :param bundle_path: A prebuilt ``dlq_replay.zip``; default: built per run. (templated)
    :param application: The app's main file; default the one next to the bundle. (templated)
    :param conf: Extra Spark configuration, merged over :data:`DEFAULT_CONF`. (templated)
    :param env_vars: Extra spark-submit environment (never secrets: it is rendered and stored). (templated)
    :param spark_submit_kwargs: Further ``SparkSubmitHook`` arguments (``driver_memory``, ``deploy_mode``...).
    :param group_actions: ``replay``/``archive``/``leave`` per error signature (mapping or JSON). (templated)
    :param window_from: Read the window frozen by this earlier run id (the reviewed dry-run). (templated)
    :param canary: Replay ``N`` (or ``"P%"``) per group first; halt groups whose canaries fail. (templated)
    :param class_data_archive: Driver JVM class-data archive: ``True`` (default folder), a path or ``False``.
    :param quick_jit: C1-only JIT for the driver JVM: ``"auto"`` (small local runs), ``True`` or ``False``.
    :param compiled_pyspark: Local master's compiled PySpark: ``True`` (default folder), a path or ``False``.
    :param reattach_timeout: Seconds (or a ``timedelta``) to wait for a live earlier attempt (``0``: none).
    :param durable: Standalone cluster mode: the next try reattaches to the driver by id (default ``True``).
    :param fail_on_canary_halt: Fail, not retried, when the canary halts a group (``False``: only warn).

    .. seealso:: ``docs/operator.md``
    """

    operator_extra_links = (DlqReplayReportLink(), SparkApplicationLink())
    template_fields: Sequence[str] = (
        *_TEMPLATED_APP_FIELDS,
        "run_id",
        "oauth2_credentials_file",
        "report_url",
        "spark_history_url",
        "bundle_path",
        "application",
        "conf",
        "env_vars",
    )
    template_fields_renderers = {"conf": "json", "env_vars": "json"}
    ui_color = "#fdebd0"

    def __init__(
        self,
        *,
        topics: str | Sequence[str],
        output_dir: str,
        mode: str = "dry-run",
        run_id: str | None = None,
        subscription: str = DEFAULT_SUBSCRIPTION,
        playbook: str | None = None,
        origin_allowlist: str | Sequence[str] | None = None,
        signatures: str | Sequence[str] | None = None,
        error_class: str | None = None,
        since: str | None = None,
        until: str | None = None,
        max_messages: int | str | None = None,
        max_replays: int = DEFAULT_MAX_REPLAYS,
        rate_limit: float | None = None,
        parallelism: int | None = None,
        archive_payload: bool | str = True,
        pulsar_conn_id: str = PulsarHook.default_conn_name,
        spark_conn_id: str = "spark_default",
        auth_token_file: str | None = None,
        oauth2_credentials_file: str | None = None,
        report_url: str | None = None,
        spark_history_url: str | None = None,
        report_payload_snippets: bool = False,
        bundle_path: str | None = None,
        application: str | None = None,
        conf: dict[str, Any] | None = None,
        env_vars: dict[str, Any] | None = None,
        spark_submit_kwargs: dict[str, Any] | None = None,
        group_actions: str | Mapping[str, str] | None = None,
        window_from: str | None = None,
        canary: str | int | None = None,
        canary_wait_seconds: float = DEFAULT_CANARY_WAIT_SECONDS,
        canary_max_failure_rate: float = 0.0,
        class_data_archive: bool | str = True,
        quick_jit: QuickJit = "auto",
        compiled_pyspark: bool | str = True,
        fail_on_canary_halt: bool = True,
        storage_conn_id: str | None = None,
        reattach_timeout: float | timedelta = 3600.0,
        durable: bool = True,
        **kwargs: Any,
    ) -> None:
        fixed_dir = output_dir.strip() if isinstance(output_dir, str) and "{{" not in output_dir else ""
        if fixed_dir and "outlets" not in kwargs:
            kwargs["outlets"] = [output_asset(fixed_dir)]
        super().__init__(**kwargs)
        if isinstance(mode, str) and "{{" not in mode:
            try:
                check_mode(mode)
            except ReplayOptionsError as exc:
                raise ReplayArgumentError(str(exc)) from None
        archive_flag(archive_payload)
        forbidden = {"application_args", "py_files", "conn_id", "env_vars", "conf", "application"}
        if clash := sorted(forbidden & set(spark_submit_kwargs or {})):
            raise ReplayArgumentError(
                f"spark_submit_kwargs must not set {clash}: the operator builds them (use the operator's "
                "own conf/env_vars/bundle_path/application arguments)."
            )
        self.topics = topics
        self.output_dir = output_dir
        self.mode = mode
        self.run_id = run_id
        self.subscription = subscription
        self.playbook = playbook
        self.origin_allowlist = origin_allowlist
        self.signatures = signatures
        self.error_class = error_class
        self.since = since
        self.until = until
        self.max_messages = max_messages
        self.max_replays = max_replays
        self.rate_limit = rate_limit
        self.parallelism = parallelism
        self.archive_payload = archive_payload
        self.pulsar_conn_id = pulsar_conn_id
        self.spark_conn_id = spark_conn_id
        self.auth_token_file = auth_token_file
        self.oauth2_credentials_file = oauth2_credentials_file
        self.report_url = report_url
        self.spark_history_url = spark_history_url
        self.report_payload_snippets = bool(report_payload_snippets)
        #: Set by ``execute`` for the extra links: where the report is, which Spark application ran.
        self.report_html_uri: str | None = None
        self.spark_application: dict[str, Any] | None = None
        self.bundle_path = bundle_path
        self.application = application
        self.conf = conf
        self.env_vars = env_vars
        self.spark_submit_kwargs = dict(spark_submit_kwargs or {})
        self.group_actions = group_actions
        self.window_from = window_from
        self.canary = canary
        self.canary_wait_seconds = canary_wait_seconds
        self.canary_max_failure_rate = canary_max_failure_rate
        self.class_data_archive = class_data_archive
        self.fail_on_canary_halt = bool(fail_on_canary_halt)
        self.storage_conn_id = storage_conn_id
        self.compiled_pyspark = compiled_pyspark
        if not (quick_jit is True or quick_jit is False or quick_jit == "auto"):
            raise ReplayArgumentError(
                f"quick_jit must be True, False or 'auto'; got {quick_jit!r}. 'auto' uses the C1-only JIT "
                "for the driver JVM of a local master."
            )
        self.quick_jit: QuickJit = quick_jit
        timeout = (
            reattach_timeout.total_seconds() if isinstance(reattach_timeout, timedelta) else reattach_timeout
        )
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0:
            raise ReplayArgumentError(
                f"reattach_timeout must be seconds >= 0 or a timedelta; got {reattach_timeout!r}."
            )
        self.reattach_timeout = float(timeout)
        self.durable = bool(durable)
        self._hook: ReplaySubmitHook | None = None
        self._client: ConnectClient | None = None
        self._killed = False

    @cached_property
    def pulsar_hook(self) -> PulsarHook:
        return PulsarHook(self.pulsar_conn_id)

    def resolve_run_id(self, context: Context) -> str:
        if self.run_id:
            return str(self.run_id)
        ti = context["ti"]
        return default_run_id(ti.dag_id, ti.task_id, ti.run_id, ti.map_index)

    def replay_args(self, run_id: str, pulsar: PulsarConnectionConfig) -> ReplayOptions:
        """Validate the rendered fields into the app's arguments (file paths only, never a secret)."""
        values = {name: getattr(self, name) for name in _APP_FIELDS}
        values.update(
            run_id=run_id,
            service_url=pulsar.service_url,
            admin_url=pulsar.admin_url,
            tls_trust_certs_file=pulsar.tls_trust_certs_file_path,
            tls_cert_file=pulsar.tls_cert_file_path,
            tls_key_file=pulsar.tls_key_file_path,
        )
        if oauth2 := pulsar.oauth2:
            values.update(
                oauth2_issuer_url=oauth2.issuer_url,
                oauth2_audience=oauth2.audience,
                oauth2_scope=oauth2.scope,
                oauth2_credentials_file=self.oauth2_credentials_file or oauth2.credentials_file,
            )
        return build_replay_args(values)

    def spark_env(self, pulsar: PulsarConnectionConfig, master: str) -> dict[str, str]:
        """spark-submit's extra environment: user ``env_vars`` and the secrets not given as files."""
        env = {str(k): str(v) for k, v in (self.env_vars or {}).items()}
        if secrets := [name for name in SECRET_ENVS if name in env]:
            raise ReplayArgumentError(
                f"env_vars must not carry {', '.join(secrets)} (rendered fields are stored); put the secret "
                f"in connection {self.pulsar_conn_id!r} (Password) or use auth_token_file / "
                "oauth2_credentials_file."
            )
        if pulsar.token and not self.auth_token_file:
            env[TOKEN_ENV] = pulsar.token
        if (oauth2 := pulsar.oauth2) and oauth2.client_secret and not self.oauth2_credentials_file:
            env[OAUTH2_CREDENTIALS_ENV] = json.dumps(
                {"client_id": oauth2.client_id, "client_secret": oauth2.client_secret}
            )
        if master.startswith("local") and "PYSPARK_PYTHON" not in os.environ:
            # Local Spark runs Python workers with this interpreter, which has pulsar-client installed.
            env.setdefault("PYSPARK_PYTHON", sys.executable)
        return lean_driver_env(env, master)

    def expected_messages(self, args: ReplayOptions) -> int | None:
        """The backlog of the run's topics, for the progress total; ``None`` if unread."""
        try:
            backlog = self.pulsar_hook.get_backlog(list(args.topics), args.subscription)
        except Exception as exc:  # only a progress estimate: never fail the run for it
            self.log.info("Backlog not read for the progress estimate (%s)", type(exc).__name__)
            return None
        return sum(item.backlog for item in backlog.values())

    def class_data_plan(self, deploy_mode: str | None, env: Mapping[str, str]) -> ArchivePlan | None:
        if self.class_data_archive is False or deploy_mode == "cluster":
            return None
        directory = self.class_data_archive if isinstance(self.class_data_archive, str) else None
        return ClassDataArchive(directory).plan({**os.environ, **env})

    def compiled_pyspark_copy(self, master: str, env: Mapping[str, str]) -> CompiledCopy | None:
        if self.compiled_pyspark is False:
            return None
        directory = self.compiled_pyspark if isinstance(self.compiled_pyspark, str) else None
        user_conf = {str(k): str(v) for k, v in (self.conf or {}).items()}
        return CompiledPySpark(directory).prepare(master, env, user_conf)

    def make_hook(
        self,
        args: ReplayOptions,
        env: Mapping[str, str],
        py_files: str,
        expected: int | None = None,
        archive: ArchivePlan | None = None,
        quick_jit: bool = False,
        master: str = "",
        compiled: CompiledCopy | None = None,
    ) -> ReplaySubmitHook:
        conf = lean_driver_conf({**DEFAULT_CONF, **{str(k): v for k, v in (self.conf or {}).items()}}, master)
        if quick_jit:
            conf = with_quick_jit(conf)
        if archive is not None:
            conf = archive.conf(conf)
        if compiled is not None:
            conf = compiled.conf(conf)
            env = compiled.env(env)
        if expected is not None:
            conf.setdefault(CONF_EXPECTED_MESSAGES, str(expected))
        if self.report_payload_snippets:
            conf[CONF_PAYLOAD_SNIPPETS] = "true"
        return ReplaySubmitHook(
            conf=conf,
            conn_id=self.spark_conn_id,
            py_files=py_files,
            name=f"dlq-replay-{args.run_id}",
            application_args=args.to_argv(),
            env_vars=dict(env) or None,
            **self.spark_submit_kwargs,
        )

    def _check_env_stays_off_argv(self, target: SparkTarget, env: Mapping[str, str]) -> None:
        if target.env_goes_on_argv and (secrets := [name for name in SECRET_ENVS if name in env]):
            raise ReplayArgumentError(
                f"Spark master {target.master!r} (deploy mode {target.deploy_mode!r}) "
                f"would put {', '.join(secrets)} on the spark-submit command line; set auth_token_file "
                "(token) or oauth2_credentials_file (OAuth2) to a file mounted on the driver and executors "
                "(e.g. a Kubernetes secret) instead."
            )

    def _locate_bundle(self, workdir: str) -> tuple[str, str]:
        """(zip path, main path): the given ones, or a fresh build from the provider's Spark app."""
        from airflow_provider_dlq.bundle import MAIN_NAME, build_bundle
        from airflow_provider_dlq.resources import spark_app_dir

        if self.bundle_path:
            return str(self.bundle_path), str(self.application or spark_app_dir() / MAIN_NAME)
        paths = build_bundle(workdir)
        return str(paths.zip_path), str(self.application or paths.main_path)

    def execute(self, context: Context) -> dict[str, Any]:
        pulsar, args, remote = self.usage_checked(self.resolve_run_id(context))
        if pulsar.tls_allow_insecure_connection:
            self.log.warning(
                "Connection %r allows insecure TLS; the replay app does not support that setting and will "
                "verify certificates (give tls_trust_certs_file_path instead).",
                self.pulsar_conn_id,
            )
        with tempfile.TemporaryDirectory(prefix="dlq-replay-bundle-", ignore_cleanup_errors=True) as workdir:
            zip_path, main_path = self._locate_bundle(workdir)
            if remote is None:
                summary_line = self._run_spark_submit(args, pulsar, zip_path, main_path, context)
            else:
                self.wait_for_earlier_attempt(args)
                env = self.spark_env(pulsar, remote.address)
                self._client = client = self.make_client(args, env, remote, zip_path, main_path, workdir)
                where = f"as a Spark Connect client of {remote.address} (connection {remote.conn_id!r})"
                self._log_start(args, where)
                client.run()
                summary_line = client.summary_line
            if self._killed:
                # spark-submit may exit 0 after SIGTERM; a killed run is never reported as done.
                raise AirflowException(
                    f"Replay run {args.run_id!r} was killed before it finished; re-running the task "
                    "resumes the same run id."
                )
            report = read_run_report(
                report_json(args), args.run_id, summary_line, self.storage_conn_id, self.log
            )
        return self._publish(context, args, report)

    def _run_spark_submit(
        self,
        args: ReplayOptions,
        pulsar: PulsarConnectionConfig,
        zip_path: str,
        main_path: str,
        context: Context,
    ) -> str | None:
        """spark-submit the app (or reattach to an earlier try's cluster driver); its summary line, if any."""
        target = spark_target(self.spark_conn_id, self.spark_submit_kwargs.get("deploy_mode"))
        master = target.master
        env = self.spark_env(pulsar, master)
        self._check_env_stays_off_argv(target, env)
        archive = self.class_data_plan(target.deploy_mode, env)
        submitted = False
        try:
            compiled = self.compiled_pyspark_copy(master, env)
            expected = self.expected_messages(args)
            if quick := quick_jit_chosen(self.quick_jit, master):
                self.log.info("Driver JVM: C1-only JIT (quick_jit=%r, %s messages)", self.quick_jit, expected)
            hook = self.make_hook(args, env, zip_path, expected, archive, quick, master, compiled)
            self._hook = hook
            store = self.driver_store(hook, context)
            if store is not None and self.reattach_driver(hook, store):
                return None
            self.wait_for_earlier_attempt(args)
            self._log_start(args, f"on Spark {master}")
            hook.run(main_path, on_submitted=None if store is None else partial(self._keep_driver_id, store))
            submitted = not self._killed
        finally:
            if archive is not None:
                archive.finish(submitted)
        return hook.summary_line

    def _log_start(self, args: ReplayOptions, where: str) -> None:
        topics = ",".join(args.topics)
        self.log.info(
            "Replay run %s (%s) of %s %s; output %s", args.run_id, args.mode, topics, where, args.output_dir
        )

    def wait_for_earlier_attempt(self, args: ReplayOptions) -> None:
        """Wait up to ``reattach_timeout`` for a live earlier attempt of this run id to end."""
        consumers = self.pulsar_hook.subscription_consumers if self.pulsar_hook.config.admin_url else None
        wait_for_earlier_attempt(
            args.run_id,
            lambda: find_holder(args.output_dir, args.topics, consumers, self.log),
            self.reattach_timeout,
            self.log,
        )

    def driver_store(self, hook: ReplaySubmitHook, context: Context) -> Any:
        """The task state store keeping a standalone cluster driver's id across tries, or ``None``."""
        if not (self.durable and hook.tracks_driver):
            return None
        if (store := context.get("task_state_store")) is None:
            self.log.info("No task state store (Airflow 3.3+): a next try cannot reattach by driver id")
        return store

    def _keep_driver_id(self, store: Any, driver_id: str) -> None:
        store.set(DRIVER_ID_KEY, driver_id)
        self.log.info("Spark driver %s kept in the task state store for a next try", driver_id)

    def reattach_driver(self, hook: ReplaySubmitHook, store: Any) -> bool:
        """Wait for an earlier try's cluster driver: True when it ended ``FINISHED``, else False."""
        if not (driver_id := str(store.get(DRIVER_ID_KEY) or "")):
            return False
        state = hook.driver_state(driver_id)
        if state in DRIVER_ACTIVE:
            self.log.info(
                "Reattaching to Spark driver %s of an earlier try (state %s): waiting for it to end",
                driver_id,
                state,
            )
            hook.reattach(driver_id)
            return True
        if state == "FINISHED":
            self.log.info("Spark driver %s of an earlier try has finished: reading its report", driver_id)
            return True
        self.log.info("Spark driver %s of an earlier try ended %s: submitting again", driver_id, state)
        return False

    def make_client(
        self,
        args: ReplayOptions,
        env: Mapping[str, str],
        remote: SparkRemote,
        zip_path: str,
        main_path: str,
        workdir: str,
    ) -> ConnectClient:
        """The app as a Spark Connect client; only ``conf``'s ``spark.sql.*`` keys reach the session."""
        user = {str(k): str(v) for k, v in (self.conf or {}).items()}
        conf = init_conf(user)
        dropped = sorted(set(user) - set(conf))
        if self.report_payload_snippets:
            dropped.append(f"{CONF_PAYLOAD_SNIPPETS} (report_payload_snippets)")
        if dropped:
            self.log.warning(
                "Spark Connect: %s do not reach the session (PySpark's Connect client applies spark.sql.* "
                "settings only); set them in the Spark Connect server's configuration.",
                ", ".join(dropped),
            )
        argv = [sys.executable, main_path, *args.to_argv()]
        return ConnectClient(
            remote, argv, client_env(os.environ, env, remote, zip_path, conf), workdir, self.log
        )

    def _publish(self, context: Context, args: ReplayOptions, report: Mapping[str, Any]) -> dict[str, Any]:
        """The run's summary: for the extra links, the task log, XCom and every outlet's asset event."""
        summary = compact_summary(report)
        self.report_html_uri = summary["paths"].get("report_html")
        self.spark_application = summary.get("spark")
        self.log.info(
            "Replay run %s: status %s, totals %s; report %s",
            summary["run_id"],
            summary["status"],
            json.dumps(summary["totals"], sort_keys=True),
            summary["paths"].get("report_json", report_json(args)),
        )
        if (halt := canary_halt_message(summary)) and self.fail_on_canary_halt:
            context["ti"].xcom_push(key="return_value", value=summary)
            self.log.error("%s", halt)
            raise AirflowFailException(halt)
        if halt:
            self.log.warning("%s", halt)
        extra = {k: summary[k] for k in ("run_id", "mode", "status", "totals", "paths", "group_count")}
        if (outlet_events := context.get("outlet_events")) is not None:
            for outlet in self.outlets:
                if isinstance(outlet, Asset):
                    outlet_events[outlet].extra = extra
        return summary

    def usage_checked(self, run_id: str) -> tuple[PulsarConnectionConfig, ReplayOptions, SparkRemote | None]:
        """The connection, app options and Connect server (``None``: spark-submit); usage errors: no retry."""
        try:
            actions = parse_group_actions(self.group_actions)
            if actions is not None and all(action == "leave" for action in actions.values()):
                raise AirflowSkipException("The approval left every group pending; nothing to replay.")
            check_topics(self.topics)  # before the connection: the trigger form's first field
            pulsar = self.pulsar_hook.config
            args = self.replay_args(run_id, pulsar)
            if (remote := spark_remote(self.spark_conn_id)) is not None:
                if self.spark_submit_kwargs:
                    raise SparkConnectConfigError(
                        f"spark_submit_kwargs ({', '.join(sorted(self.spark_submit_kwargs))}) apply to "
                        f"spark-submit, but Spark connection {self.spark_conn_id!r} is a Spark Connect "
                        "server, where the server's configuration sets them; drop spark_submit_kwargs."
                    )
                check_client_installed(remote)
        except _USAGE_ERRORS as exc:
            raise self._not_retried(exc) from exc
        return pulsar, args, remote

    def _not_retried(self, exc: Exception) -> AirflowFailException:
        message = f"{exc} (not retried: fix the configuration, then clear the task)"
        self.log.error("%s", message)  # a log line of its own, not only the exception's detail
        return AirflowFailException(message)

    def on_kill(self) -> None:
        """Stop spark-submit and everything it started, or the Spark Connect client, by PID."""
        self._killed = True
        if self._client is not None:
            self._client.stop()
        if (hook := self._hook) is not None:
            if hook.process is not None and hook.process.poll() is None:
                stop_process_tree(hook.process.pid, self.log, "spark-submit")
            hook.on_kill()
