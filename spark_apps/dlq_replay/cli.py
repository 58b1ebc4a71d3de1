"""Command line of the replay app (exit codes, output, secrets: ``docs/replay-app.md`` and ``--help``)."""

from __future__ import annotations

import argparse
import logging
import re
import sys
from typing import TYPE_CHECKING, NoReturn

from pulsar_dlq_consumer.replay_options import FLAGS, SUMMARY_PREFIX, ReplayOptionsError
from spark_apps.dlq_replay.broker_checks import check_broker
from spark_apps.dlq_replay.errors import ReplayConfigError, ReplayError, RunLockedError
from spark_apps.dlq_replay.group_actions import parse_group_actions
from spark_apps.dlq_replay.options import ReplayOptions
from spark_apps.dlq_replay.preflight import check_local
from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf, close_own_clients
from spark_apps.dlq_replay.redaction import names_secret, register_argv, scrub
from spark_apps.dlq_replay.session import (
    conf_value,
    default_parallelism,
    is_connect,
    remove_local_copies,
    ship_code,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pyspark.sql import SparkSession

log = logging.getLogger("spark_apps.dlq_replay")
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
#: The options naming a file that holds a secret: the ones named for a secret that are allowed.
_SECRET_FILE_OPTIONS = ("--auth-token-file", "--oauth2-credentials-file")
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
#: Shuffle partitions per core, unless given with --conf (Spark's 200 made a small run's shuffles tiny tasks).
SHUFFLE_PARTITIONS_PER_CORE = 2
#: Rows per Arrow batch to the Python workers, unless given with --conf: Spark's 10,000 rows of 1 KiB
#: payloads kept about 800 MiB in two workers at 100k messages; 2,000 keep about 510 MiB at the same speed.
ARROW_BATCH_ROWS = 2_000
_QUOTED_VALUE = re.compile(r"(invalid [a-z ]*?(?:value|choice)): '.*?'(?=$| \()", re.DOTALL)


class _Parser(argparse.ArgumentParser):
    """argparse that never echoes argument values in its errors (one could be a misplaced secret)."""

    def error(self, message: str) -> NoReturn:
        if "unrecognized arguments" in message:
            message = "unrecognized arguments (values not shown); see --help for the options"
        super().error(_QUOTED_VALUE.sub(r"\1 (value not shown)", message))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dlq_replay_main.py",
        allow_abbrev=False,
        description=(
            "Replay Apache Pulsar dead-letter queues with Spark: plan (freeze the window), snapshot, decide "
            "(playbook), apply (republish/archive), record (ledger), commit (ack final messages), report. "
            "Re-running a run id resumes it. The Pulsar token is read from the PULSAR_AUTH_TOKEN environment "
            "variable or --auth-token-file, never from the command line. Exit codes: 0 done, 1 failed or "
            "locked by another run (re-run the same --run-id to resume), 2 invalid input (nothing written). "
            f"Progress goes to stderr; the last stdout line is {SUMMARY_PREFIX}<json>."
        ),
    )
    for flag in FLAGS:
        parser.add_argument(flag.option, **flag.argparse_kwargs())
    return parser


def secret_option_given(args: Sequence[str]) -> bool:
    """True when an argument looks like an option carrying a secret (``--token=...``, ``--auth_tok``...)."""
    for arg in args:
        name = arg.partition("=")[0].lower().replace("_", "-")
        prefix = len(name) >= 5 and any(option.startswith(name) for option in _SECRET_OPTIONS)
        if name not in _SECRET_FILE_OPTIONS and (names_secret(arg) or prefix):
            return True
    return False


def parse_options(argv: Sequence[str] | None = None) -> ReplayOptions:
    """Parse and validate the command line (:class:`ReplayConfigError`, or ``SystemExit(2)`` on usage)."""
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
        actions = parse_group_actions(args.group_actions) if args.group_actions else None
        return ReplayOptions.from_arguments(vars(args), group_actions=actions)
    except ReplayOptionsError as exc:  # parse_time, CanarySpec.parse
        raise ReplayConfigError(str(exc)) from None


class _StderrHandler(logging.StreamHandler):
    """Writes to the current ``sys.stderr``, without what could be a secret (tracebacks included)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr  # as it is now: a swapped one is honoured
        super().emit(record)

    def format(self, record: logging.LogRecord) -> str:
        return scrub(super().format(record))


def configure_logging() -> None:
    """Progress logs to stderr; stdout carries only the summary. Idempotent."""
    root = logging.getLogger("spark_apps")
    if not any(isinstance(h, _StderrHandler) for h in root.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    root.setLevel(logging.INFO)
    root.propagate = False
    logging.getLogger("spark_apps.dlq_replay.pulsar_client").setLevel(logging.WARNING)


def _fail(message: str) -> None:
    print(f"dlq-replay: error: {scrub(message)}", file=sys.stderr, flush=True)


def apply_session_defaults(spark: SparkSession) -> None:
    """Size the shuffles to the cores and the Arrow batches to the workers, unless given or refused."""
    defaults = {
        "spark.sql.shuffle.partitions": str(max(2, SHUFFLE_PARTITIONS_PER_CORE * default_parallelism(spark))),
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(ARROW_BATCH_ROWS),
    }
    for key, value in defaults.items():
        if conf_value(spark, key) is not None or conf_value(spark, f"spark.hadoop.{key}") is not None:
            continue
        try:
            spark.conf.set(key, value)
        except Exception as exc:
            log.info("session setting %s left as it is: the session refuses it (%s)", key, type(exc).__name__)


def build_session(run_id: str) -> SparkSession:
    """The run's session (classic or Spark Connect) with the app's defaults and, under Connect, its code."""
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.appName(f"dlq-replay {run_id}")
        .config("spark.sql.session.timeZone", "UTC")
        # Spark's own log at WARN, so our progress lines stay readable (a Connect server keeps its own).
        .config("spark.log.level", "WARN")
        .getOrCreate()
    )
    apply_session_defaults(spark)
    ship_code(spark)
    return spark


def main(argv: Sequence[str] | None = None) -> int:
    """Run the app; returns the process exit code (``EXIT_OK``, ``EXIT_FAILED`` or ``EXIT_USAGE``)."""
    configure_logging()
    register_argv(sys.argv[1:] if argv is None else argv)  # never printed, whatever option they were in
    run_id = None  # set once the checks before Spark passed
    try:
        options = parse_options(argv)
        playbook = check_local(options)
        check_broker(PulsarConf.from_app_options(options), options.topics)
        from spark_apps.dlq_replay.report import summary_line, summary_text
        from spark_apps.dlq_replay.runner import run_replay

        run_id = options.run_id
        spark = build_session(run_id)
        report = run_replay(spark, options, checked=playbook)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2), already printed
        return int(exc.code or 0)
    except ReplayConfigError as exc:  # the Pulsar I/O's PulsarConfigError too
        _fail(str(exc))
        return EXIT_USAGE
    except ReplayError as exc:
        if run_id is None or isinstance(exc, RunLockedError):  # nothing listens, or another run holds it
            _fail(str(exc))
        else:
            log.error("run %s failed: %s; re-run the same --run-id to resume", run_id, exc)
        return EXIT_FAILED
    except Exception:
        log.exception("run %s failed; re-run the same --run-id to resume", run_id)
        return EXIT_FAILED
    finally:
        # Not in atexit hooks: the app leaves with os._exit (see dlq_replay_main), which runs none.
        close_own_clients()
        remove_local_copies()
    print(summary_text(report), summary_line(report), sep="\n", flush=True)
    if is_connect(spark):  # releases the server's session
        spark.stop()
    # A classic session is stopped by spark-submit's JVM as the driver exits (Spark's shutdown hook), which
    # is up to a second sooner than stop() from Python, whose shutdown waits on a server of its own.
    return EXIT_OK
