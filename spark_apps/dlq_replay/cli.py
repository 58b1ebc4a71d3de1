"""Command line of the replay app: ``spark-submit --py-files <bundle.zip> dlq_replay_main.py --help``.

The contract (``docs/replay-app.md``):

* exit code 0: the run finished (messages may be left pending; status ``partial`` when sends failed);
  2: invalid input, found before anything is written (options, files, permissions, playbook, fixes, or
  a resume with changed options); 1: the run failed or another run holds the lock; re-run the same
  ``--run-id`` to resume;
* progress and errors on the Python driver's stderr (under ``spark-submit`` Spark's ``PythonRunner``
  merges it into its stdout, ahead of the summary);
* stdout: a human summary, then as its last line ``DLQ_REPLAY_SUMMARY {json}``.

The same program runs on ``local[n]``, on a cluster and under Spark Connect (``spark-submit --remote
sc://...``): the driver uses the public ``SparkSession`` API only (:mod:`~spark_apps.dlq_replay.session`).

Tokens are never accepted as arguments and no value that could be one is ever printed: the Pulsar
token comes from the ``PULSAR_AUTH_TOKEN`` environment variable or from ``--auth-token-file``.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from typing import TYPE_CHECKING, Any

from pulsar_dlq_consumer.replay_options import (
    DEFAULT_CANARY_WAIT_SECONDS,
    DRY_RUN,
    MODES,
    SUMMARY_PREFIX,
    CanarySpec,
    ReplayOptionsError,
)
from spark_apps.dlq_replay.errors import ReplayConfigError, ReplayError, RunLockedError
from spark_apps.dlq_replay.group_actions import parse_group_actions
from spark_apps.dlq_replay.options import (
    DEDUP_WAVE_SIZE,
    DEFAULT_IDLE_TIMEOUT_MS,
    DEFAULT_MAX_REPLAYS,
    DEFAULT_SUBSCRIPTION,
    DEFAULT_WAVE_SIZE,
    ReplayOptions,
    parse_time,
    split_list,
)
from spark_apps.dlq_replay.redaction import register_argv, scrub

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pyspark.sql import SparkSession

log = logging.getLogger("spark_apps.dlq_replay")
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
#: Words that make a command-line option look like it carries a secret (compared without case, ``_`` as
#: ``-``); the options naming a file that holds a secret are the ones we accept.
_SECRET_WORDS = ("token", "auth-param", "password", "passwd", "secret", "jwt", "credential")
_TOKEN_FILE_OPTION = "--auth-token-file"
_SECRET_FILE_OPTIONS = (_TOKEN_FILE_OPTION, "--oauth2-credentials-file")
#: Options other tools take a token with: a prefix of one of these (``--auth-tok``) is refused as well.
_SECRET_OPTIONS = (
    "--auth-token",
    "--token",
    "--pulsar-token",
    "--auth-params",
    "--password",
    "--oauth2-client-secret",
    "--client-secret",
)
#: Shuffle partitions per core, unless ``spark.sql.shuffle.partitions`` is given with --conf. Spark's 200
#: made every shuffle of a small run (the duplicate window, the entry count, the report's aggregates)
#: 200 tiny tasks; a DLQ run's shuffles carry light rows (ids, counts), so two tasks per core suffice
#: and adaptive execution still coalesces or splits them.
SHUFFLE_PARTITIONS_PER_CORE = 2
#: Rows per Arrow batch between the JVM and the Python workers, unless
#: ``spark.sql.execution.arrow.maxRecordsPerBatch`` is given with --conf. Spark's 10,000 rows of 1 KiB
#: payloads (and their property dicts in the decide pass) kept about 800 MiB in two workers at 100k
#: messages; 2,000 keep about 510 MiB at the same speed.
ARROW_BATCH_ROWS = 2_000
_QUOTED_VALUE = re.compile(r"(invalid [a-z ]*?(?:value|choice)): '.*?'(?=$| \()", re.DOTALL)


class _Parser(argparse.ArgumentParser):
    """argparse without abbreviations that never echoes argument values in its errors (one of them
    could be a secret typed in the wrong place)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(allow_abbrev=False, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        if "unrecognized arguments" in message:
            message = "unrecognized arguments (values not shown); see --help for the options"
        else:
            message = _QUOTED_VALUE.sub(r"\1 (value not shown)", message)
        self.print_usage(err_stream())
        err_stream().write(f"{self.prog}: error: {message}\n")
        err_stream().flush()
        raise SystemExit(EXIT_USAGE)

    def exit(self, status: int = 0, message: str | None = None) -> None:  # type: ignore[override]
        if message:
            err_stream().write(message)
            err_stream().flush()
        raise SystemExit(status)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dlq_replay_main.py",
        description=(
            "Replay Apache Pulsar dead-letter queues with Spark: plan (freeze the window), snapshot, decide "
            "(playbook), apply (republish/archive), record (ledger), commit (ack final messages), report. "
            "Re-running a run id resumes it. The Pulsar token is read from the PULSAR_AUTH_TOKEN environment "
            "variable or --auth-token-file, never from the command line. Exit codes: 0 done, 1 failed or "
            "locked by another run (re-run the same --run-id to resume), 2 invalid input (nothing written). "
            f"Progress goes to stderr; the last stdout line is {SUMMARY_PREFIX}<json>."
        ),
    )
    add = parser.add_argument
    add(
        "--run-id", required=True, help="Id of this run (e.g. the Airflow run id); re-use it to resume a run."
    )
    add(
        "--mode",
        choices=MODES,
        default=DRY_RUN,
        help="dry-run: decide and report only, change nothing (default). replay: republish, archive, drop, "
        "record and ack. archive-only: like replay but never republish (republish rules are skipped).",
    )
    add("--service-url", required=True, help="Pulsar binary service URL, e.g. pulsar://localhost:6650.")
    add(
        _TOKEN_FILE_OPTION,
        metavar="PATH",
        help="File holding the Pulsar JWT token (else env PULSAR_AUTH_TOKEN; unset means no auth).",
    )
    add("--tls-trust-certs-file", metavar="PATH", help="CA bundle for pulsar+ssl:// service URLs.")
    add(
        "--admin-url",
        metavar="URL",
        help="Apache Pulsar admin REST, e.g. http://broker:8080 (same credentials and CA as the service). "
        "When it answers, each DLQ message is read once (Readers) and commit acks ids from the ledger; "
        "without it the DLQ is read twice through Shared consumers (the embedded broker's mode).",
    )
    add(
        "--tls-cert-file",
        metavar="PATH",
        help="Client certificate (PEM) for pulsar+ssl://: the authentication without a token or OAuth2 "
        "(AuthenticationTls), else mutual TLS. Needs --tls-key-file.",
    )
    add("--tls-key-file", metavar="PATH", help="Private key (PEM) of --tls-cert-file.")
    add("--oauth2-issuer-url", metavar="URL", help="OAuth2 client credentials: the issuer URL.")
    add("--oauth2-audience", metavar="AUDIENCE", help="OAuth2 audience (optional).")
    add("--oauth2-scope", metavar="SCOPE", help="OAuth2 scope (optional).")
    add(
        "--oauth2-credentials-file",
        metavar="PATH",
        help='OAuth2 key file {"client_id": ..., "client_secret": ...} (else env PULSAR_OAUTH2_CREDENTIALS '
        "with the same JSON).",
    )
    add("--topics", required=True, metavar="T1,T2", help="DLQ topics to replay, comma-separated.")
    add(
        "--subscription",
        default=DEFAULT_SUBSCRIPTION,
        help=f"Durable Shared subscription to read and ack through (default {DEFAULT_SUBSCRIPTION}).",
    )
    add(
        "--playbook",
        metavar="PATH",
        help="Playbook YAML (docs/playbook.md). Without it every message is skipped.",
    )
    add(
        "--output-dir",
        required=True,
        metavar="URI",
        help="Root for runs/<run_id>/, archive/ and ledger/: a local path or a URI pyarrow opens (s3://, "
        "s3a://, gs://, hdfs://); an object store needs --subscription-lease on.",
    )
    add(
        "--origin-allowlist",
        metavar="GLOB[,GLOB]",
        help="Topics a message may be republished to (its origin must match): globs on full topic names "
        "(* within a path part, ** across), or re:<regex>. Required for --mode replay.",
    )
    add("--signatures", metavar="S1,S2", help="Only act on these error signatures (from a report).")
    add(
        "--group-actions",
        metavar="JSON|@FILE",
        help="Approved action per error signature, overriding the playbook for this run: a JSON object "
        '{"<signature>": "replay"|"archive"|"leave"} or @path of a file holding it (docs/approval.md).',
    )
    add(
        "--canary",
        metavar="N|P%",
        help="Republish N messages (or P%%) of each error group first, watch them for --canary-wait-seconds "
        "and halt groups whose canaries fail again (left pending as canary_failed); docs/canary.md.",
    )
    add(
        "--canary-wait-seconds",
        type=float,
        default=DEFAULT_CANARY_WAIT_SECONDS,
        metavar="S",
        help="How long the canary is watched before the rest is sent "
        f"(default {DEFAULT_CANARY_WAIT_SECONDS:g}).",
    )
    add(
        "--canary-max-failure-rate",
        type=float,
        default=0.0,
        metavar="RATE",
        help="Halt a group when more than this share of its canaries fail again (default 0: any).",
    )
    add(
        "--canary-watch-topics",
        metavar="T1,T2",
        help="Topics watched for failed canaries besides the DLQ topics and their -RETRY siblings.",
    )
    add(
        "--window-from",
        metavar="RUN_ID",
        help="Read the window frozen by this earlier run (e.g. the reviewed dry-run) instead of freezing a "
        "new one; same --output-dir, --topics and --subscription.",
    )
    add("--error-class", metavar="NAME", help="Only act on this error class (full or simple class name).")
    add(
        "--since",
        metavar="ISO8601",
        help="Only act on DLQ messages published at or after this time (UTC if no offset).",
    )
    add(
        "--until",
        metavar="ISO8601",
        help="Only act on DLQ messages published before this time (UTC if no offset).",
    )
    add(
        "--max-messages",
        type=int,
        metavar="N",
        help="Act on at most N messages (oldest first); the rest wait.",
    )
    add(
        "--max-replays",
        type=int,
        default=DEFAULT_MAX_REPLAYS,
        metavar="N",
        help="Loop guard: a message with REPLAY_COUNT >= N is archived instead of republished "
        f"(default {DEFAULT_MAX_REPLAYS}).",
    )
    add(
        "--rate-limit",
        type=float,
        metavar="MSGS_PER_S",
        help="Cap on republished messages per second (whole run).",
    )
    add(
        "--parallelism",
        type=int,
        metavar="N",
        help="Readers per DLQ partition for the snapshot (reader mode; default: enough to keep every core "
        "busy) and producers per origin topic (default: Spark's default parallelism).",
    )
    add(
        "--archive-payload",
        choices=("on", "off"),
        default="on",
        help="Archive payloads (on, default) or only their SHA-256 (off); playbooks can say off per rule.",
    )
    add(
        "--idle-timeout-ms",
        type=int,
        default=DEFAULT_IDLE_TIMEOUT_MS,
        metavar="MS",
        help=f"Stop reading a partition after this long idle (default {DEFAULT_IDLE_TIMEOUT_MS}).",
    )
    add(
        "--wave-size",
        type=int,
        default=None,
        metavar="N",
        help="Republish in waves of N messages per producer, each saved before the next; after a kill a "
        "resumed run re-sends at most the wave in flight: N x producers messages, which reach the origin "
        f"twice on a broker without deduplication (default {DEFAULT_WAVE_SIZE}; {DEDUP_WAVE_SIZE} when the "
        "admin REST shows deduplication on every target topic, where a re-send is dropped by the broker).",
    )
    add(
        "--subscription-lease",
        choices=("on", "off"),
        default="on",
        help="Hold a broker lease per DLQ topic and subscription for the whole run, so no other replay "
        "(whatever its output dir) reads the same subscription at the same time (default on). It needs "
        "permission to consume a small lease topic in the DLQ's namespace; 'off' relies on the output "
        "directory lock alone, which only a local --output-dir can hold.",
    )
    return parser


def secret_option_given(args: Sequence[str]) -> bool:
    """True when an argument looks like an option carrying a secret (``--auth-token``, ``--token=...``,
    ``--auth_tok``, ``--password``...); ``--auth-token-file`` is fine."""
    for arg in args:
        if not arg.startswith("-"):
            continue
        name = arg.split("=", 1)[0].lower().replace("_", "-")
        if name in _SECRET_FILE_OPTIONS:
            continue
        if any(word in name for word in _SECRET_WORDS):
            return True
        if len(name) >= 5 and any(option.startswith(name) for option in _SECRET_OPTIONS):
            return True
    return False


def parse_options(argv: Sequence[str] | None = None) -> ReplayOptions:
    """Parse and validate the command line. Raises :class:`ReplayConfigError`, or ``SystemExit(2)`` on
    usage errors (never echoing a value)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if secret_option_given(args_list):
        raise ReplayConfigError(
            "an option that looks like it carries a secret was given (value not shown): secrets never go "
            "on the command line. Set the PULSAR_AUTH_TOKEN (or PULSAR_OAUTH2_CREDENTIALS) environment "
            "variable, or pass --auth-token-file PATH (or --oauth2-credentials-file PATH), and rotate the "
            "secret if it was typed in a shell (it may be in the shell history)"
        )
    args = build_parser().parse_args(args_list)
    try:
        return _options(args)
    except ReplayOptionsError as exc:  # parse_time, CanarySpec.parse
        raise ReplayConfigError(str(exc)) from None


def _options(args: argparse.Namespace) -> ReplayOptions:
    """The parsed arguments as the run's options (the inverse of ``ReplayOptions.to_argv``)."""
    return ReplayOptions(
        run_id=args.run_id,
        mode=args.mode,
        service_url=args.service_url,
        auth_token_file=args.auth_token_file,
        tls_trust_certs_file=args.tls_trust_certs_file,
        admin_url=args.admin_url.strip().rstrip("/") if args.admin_url else None,
        tls_cert_file=args.tls_cert_file,
        tls_key_file=args.tls_key_file,
        oauth2_issuer_url=args.oauth2_issuer_url,
        oauth2_audience=args.oauth2_audience,
        oauth2_scope=args.oauth2_scope,
        oauth2_credentials_file=args.oauth2_credentials_file,
        topics=split_list(args.topics) or (),
        subscription=args.subscription,
        playbook=args.playbook,
        output_dir=args.output_dir,
        origin_allowlist=split_list(args.origin_allowlist),
        signatures=split_list(args.signatures),
        error_class=args.error_class.strip() if args.error_class else None,
        since=parse_time(args.since, "--since") if args.since else None,
        until=parse_time(args.until, "--until") if args.until else None,
        max_messages=args.max_messages,
        max_replays=args.max_replays,
        rate_limit=args.rate_limit,
        parallelism=args.parallelism,
        archive_payload=args.archive_payload == "on",
        idle_timeout_ms=args.idle_timeout_ms,
        wave_size=args.wave_size,
        subscription_lease=args.subscription_lease == "on",
        group_actions=parse_group_actions(args.group_actions) if args.group_actions else None,
        window_from=args.window_from.strip() if args.window_from else None,
        canary=CanarySpec.parse(
            args.canary,
            args.canary_wait_seconds,
            args.canary_max_failure_rate,
            split_list(args.canary_watch_topics) or (),
        )
        if args.canary
        else None,
    )


# --------------------------------------------------------------------------- stderr


def err_stream() -> Any:
    """Where progress and errors go: ``sys.stderr``, looked up at each call (a swapped one is honoured)."""
    return sys.stderr


class _StderrHandler(logging.StreamHandler):
    """Writes to :func:`err_stream` at the time of each record."""

    @property
    def stream(self) -> Any:
        return err_stream()

    @stream.setter
    def stream(self, value: object) -> None:
        pass


class _ScrubbingFormatter(logging.Formatter):
    """Formats a record, tracebacks included, then removes what could be a secret
    (:func:`~spark_apps.dlq_replay.redaction.scrub`)."""

    def format(self, record: logging.LogRecord) -> str:
        return scrub(super().format(record))


def configure_logging() -> None:
    """Progress logs to stderr; stdout carries only the summary. Idempotent."""
    root = logging.getLogger("spark_apps")
    if not any(isinstance(h, _StderrHandler) for h in root.handlers):
        handler = _StderrHandler()
        handler.setFormatter(_ScrubbingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    root.setLevel(logging.INFO)
    root.propagate = False
    logging.getLogger("spark_apps.dlq_replay.pulsar_client").setLevel(logging.WARNING)


def _fail(message: str) -> None:
    stream = err_stream()
    stream.write(f"dlq-replay: error: {scrub(message)}\n")
    stream.flush()


# --------------------------------------------------------------------------- main


def session_defaults(cores: int) -> dict[str, str]:
    """Session settings the app applies unless given with --conf: shuffle partitions sized to the
    ``cores`` of the application (:data:`SHUFFLE_PARTITIONS_PER_CORE`) and :data:`ARROW_BATCH_ROWS`. All
    are runtime settings, which a Spark Connect session accepts too."""
    partitions = max(2, SHUFFLE_PARTITIONS_PER_CORE * max(1, cores))
    return {
        "spark.sql.shuffle.partitions": str(partitions),
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(ARROW_BATCH_ROWS),
    }


def apply_session_defaults(spark: SparkSession) -> dict[str, str]:
    """Set :func:`session_defaults` on ``spark`` where neither the setting nor its ``spark.hadoop.``
    form was given (``--conf``, the cluster's defaults); a setting the session refuses (e.g. one a
    Spark Connect server does not let a client change) is left as it is. Returns what was set."""
    from spark_apps.dlq_replay.session import conf_value, default_parallelism

    applied: dict[str, str] = {}
    for key, value in session_defaults(default_parallelism(spark)).items():
        if conf_value(spark, key) is not None or conf_value(spark, f"spark.hadoop.{key}") is not None:
            continue
        try:
            spark.conf.set(key, value)
        except Exception as exc:
            log.info("session setting %s left as it is: the session refuses it (%s)", key, type(exc).__name__)
            continue
        applied[key] = value
    return applied


def build_session(run_id: str) -> SparkSession:
    """The run's session (classic or Spark Connect, as spark-submit set it up) with the app's defaults
    and, under Spark Connect, the app's code added for the server's Python workers."""
    from pyspark.sql import SparkSession

    from spark_apps.dlq_replay.session import ship_code

    spark = (
        SparkSession.builder.appName(f"dlq-replay {run_id}")
        .config("spark.sql.session.timeZone", "UTC")
        # Spark's own log at WARN, so our progress lines stay readable in the task log (a classic
        # session applies it as it starts; a Spark Connect server keeps its own).
        .config("spark.log.level", "WARN")
        .getOrCreate()
    )
    apply_session_defaults(spark)
    ship_code(spark)
    return spark


def main(argv: Sequence[str] | None = None) -> int:
    """Run the app; returns the process exit code (see the module docstring)."""
    configure_logging()
    register_argv(sys.argv[1:] if argv is None else argv)  # never printed, whatever option they were in
    try:
        options = parse_options(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2), already printed
        return int(exc.code or 0)
    except ReplayConfigError as exc:
        _fail(str(exc))
        return EXIT_USAGE
    from spark_apps.dlq_replay.preflight import check_local

    try:
        check_local(options)  # files, permissions, playbook: before Spark starts, nothing written
        check_broker_of(options)  # listening, credentials, DLQ topics: before Spark starts too
    except ReplayConfigError as exc:
        _fail(str(exc))
        return EXIT_USAGE
    except ReplayError as exc:  # nothing listens at the service URL: nothing written, re-run later
        _fail(str(exc))
        return EXIT_FAILED
    from spark_apps.dlq_replay.pulsar_io.errors import PulsarConfigError
    from spark_apps.dlq_replay.report import summary_line, summary_text
    from spark_apps.dlq_replay.runner import run_replay

    spark = build_session(options.run_id)
    try:
        report = run_replay(spark, options, broker_checked=True)
    except (ReplayConfigError, PulsarConfigError) as exc:
        _fail(str(exc))
        return EXIT_USAGE
    except RunLockedError as exc:
        _fail(str(exc))
        return EXIT_FAILED
    except ReplayError as exc:
        log.error("run %s failed: %s; re-run the same --run-id to resume", options.run_id, exc)
        return EXIT_FAILED
    except Exception:
        log.exception("run %s failed; re-run the same --run-id to resume", options.run_id)
        return EXIT_FAILED
    finally:
        close_pulsar_clients()
        remove_local_copies()
    print(summary_text(report), flush=True)
    print(summary_line(report), flush=True)
    spark.stop()
    return EXIT_OK


def remove_local_copies() -> None:
    """Remove this process's copies of the fix files (a Spark Connect client's, see
    :func:`~spark_apps.dlq_replay.session.add_pyfile`): the app leaves with ``os._exit``, which runs no
    exit handlers."""
    from spark_apps.dlq_replay.session import remove_local_copies as remove

    remove()


def check_broker_of(options: ReplayOptions) -> None:
    """:func:`~spark_apps.dlq_replay.broker_checks.check_broker` for the run's options (no Spark
    needed); a Pulsar configuration error becomes a ``ReplayConfigError``."""
    from spark_apps.dlq_replay.broker_checks import check_broker
    from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf
    from spark_apps.dlq_replay.pulsar_io.errors import PulsarConfigError

    try:
        check_broker(PulsarConf.from_app_options(options), options.topics)
    except PulsarConfigError as exc:
        raise ReplayConfigError(str(exc)) from exc


def close_pulsar_clients() -> None:
    """Close this process's Pulsar clients now, not in an atexit hook: closing a client that has a
    Python logger during interpreter shutdown can abort the process (apache/pulsar-client-python#256)."""
    from spark_apps.dlq_replay.pulsar_io import conf

    conf.close_own_clients()
