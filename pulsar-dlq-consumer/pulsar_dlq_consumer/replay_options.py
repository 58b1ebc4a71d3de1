"""The options of one DLQ replay run: the contract between the Airflow operator and the Spark replay app.

Checks run on construction, so a bad option fails before Spark starts. Secrets are never options (the app
reads them from the environment or files).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Self

from pulsar_dlq_consumer.errors import ConfigurationError
from pulsar_dlq_consumer.topics import normalize_topic

DRY_RUN = "dry-run"
REPLAY = "replay"
ARCHIVE_ONLY = "archive-only"
MODES: tuple[str, ...] = (DRY_RUN, REPLAY, ARCHIVE_ONLY)
#: The replayer's durable subscription on the DLQ topics, unless a run names another.
DEFAULT_SUBSCRIPTION = "dlq-replayer"
#: Loop guard: a message replayed this often is archived instead of republished.
DEFAULT_MAX_REPLAYS = 3
DEFAULT_IDLE_TIMEOUT_MS = 3000
DEFAULT_CANARY_WAIT_SECONDS = 60.0
#: Sequence ids per producer and wave (``--wave-size``; ``docs/reliability.md`` has the measured costs).
DEFAULT_WAVE_SIZE = 2_000
#: The wave size when every target topic deduplicates: a re-sent wave costs only the time to send it, and
#: each wave is a Spark job that waits for its slowest task (1M messages on 8 producers: one wave).
DEDUP_WAVE_SIZE = 250_000
#: The app's last stdout line starts with this, followed by the run's summary as JSON.
SUMMARY_PREFIX = "DLQ_REPLAY_SUMMARY "
#: Spark setting that opts a run in to masked payload snippets in its report (default false).
CONF_PAYLOAD_SNIPPETS = "spark.dlq.report.payloadSnippets"
#: Spark setting: the backlog the snapshot is expected to read, for the progress lines' percentages.
CONF_EXPECTED_MESSAGES = "spark.dlq.progress.expectedMessages"
#: Environment variables carrying the Pulsar token and the OAuth2 client credentials (JSON) to the app.
TOKEN_ENV = "PULSAR_AUTH_TOKEN"
OAUTH2_CREDENTIALS_ENV = "PULSAR_OAUTH2_CREDENTIALS"
#: The words a yes/no setting takes (Spark settings, data-source options, connection extras), lower-cased.
BOOLEAN_WORDS = dict.fromkeys(("true", "1", "yes", "on"), True) | dict.fromkeys(
    ("false", "0", "no", "off"), False
)
#: The refusal of a run without DLQ topics.
TOPICS_REQUIRED = "--topics is required: the DLQ topics to replay, comma-separated"
#: What an approval may decide for an error group (``--group-actions``).
GROUP_ACTIONS = ("replay", "archive", "leave")

_SIGNATURE = re.compile(r"[0-9a-f]{16}")
_RUN_ID = re.compile(r"[^\x00-\x1f/\\]{1,250}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CANARY_SIZE = re.compile(r"\s*(?P<n>[0-9]+(?:\.[0-9]+)?)\s*(?P<pct>%?)\s*")
#: The numeric options with a lower bound, by field; ``None`` means not given.
_MINIMUMS = {"max_messages": 1, "max_replays": 1, "parallelism": 1, "idle_timeout_ms": 100, "wave_size": 1}


class ReplayOptionsError(ConfigurationError):
    """An option of a replay run is invalid; the message names the option, what is wrong and the fix."""


def check_run_id(run_id: object, option: str = "--run-id") -> str:
    """``run_id`` if it is a valid run id (e.g. an Airflow run id; the error says what one is)."""
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id) or run_id.strip() != run_id:
        raise ReplayOptionsError(
            f"{option}: invalid run id: use 1-250 printable characters without '/', '\\' or surrounding "
            "spaces (e.g. an Airflow run id such as manual__2024-05-01T00:00:00+00:00)"
        )
    return run_id


def check_mode(mode: object) -> None:
    if mode not in MODES:
        raise ReplayOptionsError(f"--mode must be one of {', '.join(MODES)}; got {mode!r}")


def parse_time(value: str, option: str) -> datetime:
    """ISO 8601 date or date-time; without an offset it is taken as UTC."""
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError as exc:
        raise ReplayOptionsError(
            f"{option} is not an ISO 8601 date or time (value not shown); use e.g. 2024-05-01 or "
            "2024-05-01T12:00:00+00:00"
        ) from exc
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def split_list(value: str | None) -> tuple[str, ...] | None:
    """``"a, b,,c"`` -> ``("a", "b", "c")``; ``None``/empty -> ``None``."""
    return tuple(p.strip() for p in (value or "").split(",") if p.strip()) or None


@dataclass(frozen=True)
class CanarySpec:
    """How big the canary is, how long to watch it and when a group halts (``docs/canary.md``)."""

    count: int | None = None
    percent: float | None = None
    wait_seconds: float = DEFAULT_CANARY_WAIT_SECONDS
    max_failure_rate: float = 0.0
    watch_topics: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.wait_seconds >= 0:
            raise ReplayOptionsError(f"--canary-wait-seconds must be >= 0; got {self.wait_seconds}")
        if not 0 <= self.max_failure_rate < 1:
            raise ReplayOptionsError(
                "--canary-max-failure-rate must be in [0, 1) (0: any failure halts); "
                f"got {self.max_failure_rate}"
            )

    @classmethod
    def parse(cls, size: str, **settings: Any) -> CanarySpec:
        """``--canary``: ``N`` messages or ``P%`` of each group; ``settings`` are the other fields."""
        match = _CANARY_SIZE.fullmatch(str(size or ""))
        if not match:
            raise ReplayOptionsError(
                f"--canary must be a count (e.g. 5) or a percentage (e.g. 10%); got {size!r}"
            )
        number, pct = float(match.group("n")), bool(match.group("pct"))
        if pct and not 0 < number <= 100:
            raise ReplayOptionsError(f"--canary percentage must be in (0, 100]; got {size!r}")
        if not pct and (number < 1 or number != int(number)):
            raise ReplayOptionsError(f"--canary count must be an integer >= 1; got {size!r}")
        return cls(None, number, **settings) if pct else cls(int(number), None, **settings)

    @property
    def label(self) -> str:
        return f"{self.percent:g}%" if self.percent is not None else str(self.count)

    def fingerprint(self) -> dict[str, Any]:
        return {
            "size": self.label,
            "wait_seconds": self.wait_seconds,
            "max_failure_rate": self.max_failure_rate,
            "watch_topics": list(self.watch_topics),
        }


@dataclass(frozen=True)
class ReplayOptions:
    """Everything a replay run needs: a field per option of :data:`FLAGS` (canary settings: a CanarySpec)."""

    run_id: str
    output_dir: str
    service_url: str
    topics: tuple[str, ...]
    mode: str = DRY_RUN
    subscription: str = DEFAULT_SUBSCRIPTION
    auth_token_file: str | None = None
    tls_trust_certs_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    oauth2_issuer_url: str | None = None
    oauth2_audience: str | None = None
    oauth2_scope: str | None = None
    oauth2_credentials_file: str | None = None
    playbook: str | None = None
    origin_allowlist: tuple[str, ...] | None = None
    signatures: tuple[str, ...] | None = None
    error_class: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    max_messages: int | None = None
    max_replays: int = DEFAULT_MAX_REPLAYS
    rate_limit: float | None = None
    parallelism: int | None = None
    archive_payload: bool = True
    idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS
    wave_size: int | None = None
    subscription_lease: bool = True
    group_actions: dict[str, str] | None = None
    window_from: str | None = None
    canary: CanarySpec | None = None
    admin_url: str | None = None

    def __post_init__(self) -> None:
        check_run_id(self.run_id)
        check_mode(self.mode)
        if not self.output_dir or not self.output_dir.strip():
            raise ReplayOptionsError(
                "--output-dir is required: the root of runs/, archive/ and ledger/ (a local path or a "
                "Hadoop URI such as s3a://bucket/dlq)"
            )
        if not self.service_url:
            raise ReplayOptionsError("--service-url is required, e.g. pulsar://broker:6650")
        self._check_topics()
        if not self.subscription or not self.subscription.strip() or _CONTROL.search(self.subscription):
            raise ReplayOptionsError(
                "--subscription must be a non-empty name without control characters "
                f"(default {DEFAULT_SUBSCRIPTION})"
            )
        self._check_selection()
        self._check_limits()
        if self.window_from is not None and check_run_id(self.window_from, "--window-from") == self.run_id:
            raise ReplayOptionsError("--window-from must name an earlier run, not this --run-id")

    def _check_topics(self) -> None:
        if not self.topics:
            raise ReplayOptionsError(TOPICS_REQUIRED)
        for topic in self.topics:
            try:
                normalize_topic(topic)
            except ConfigurationError as exc:
                raise ReplayOptionsError(f"--topics: {exc}") from None
        if self.mode == REPLAY and not self.origin_allowlist:
            raise ReplayOptionsError(
                "--origin-allowlist is required in replay mode: the topics a message may be republished to, "
                "as globs (persistent://public/default/orders*) or regexes (re:...), comma-separated"
            )

    def _check_selection(self) -> None:
        if bad := {k: v for k, v in (self.group_actions or {}).items() if v not in GROUP_ACTIONS}:
            raise ReplayOptionsError(f"--group-actions: {bad} must each be one of {', '.join(GROUP_ACTIONS)}")
        if not all(_SIGNATURE.fullmatch(signature) for signature in self.signatures or ()):
            raise ReplayOptionsError(
                "--signatures: a signature is 16 lower-case hex digits, as in the `signature` of a "
                "report group (e.g. 3f1c9a0b2d4e6f81)"
            )
        if self.error_class is not None and not self.error_class:
            raise ReplayOptionsError("--error-class must not be empty; give a class name such as ValueError")
        if self.since and self.until and self.since >= self.until:
            raise ReplayOptionsError(
                f"--since ({self.since.isoformat()}) must be before --until ({self.until.isoformat()})"
            )

    def _check_limits(self) -> None:
        for name, minimum in _MINIMUMS.items():
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or value < minimum):
                raise ReplayOptionsError(f"--{name.replace('_', '-')} must be >= {minimum}; got {value}")
        if self.rate_limit is not None and self.rate_limit <= 0:
            raise ReplayOptionsError(f"--rate-limit must be > 0 messages/s; got {self.rate_limit}")

    def to_argv(self) -> list[str]:
        """The app's command line for these options (:data:`FLAGS`; the inverse of :func:`from_arguments`)."""
        argv: list[str] = []
        for flag in FLAGS:
            if flag.name not in _CANARY_FLAGS:
                value = getattr(self, flag.name)
            else:  # --canary is the canary's label, --canary-X its attribute X
                name = "label" if flag.name == "canary" else flag.name.removeprefix("canary_")
                value = getattr(self.canary, name) if self.canary else None
            if text := flag.text(value):
                argv += [flag.option, text]
        return argv

    @classmethod
    def from_arguments(cls, values: dict[str, Any], **fields: Any) -> Self:
        """The options of the parsed command line ``values`` (one entry per :data:`FLAGS` name, ``None``
        when not given); ``fields`` are taken as given instead (``group_actions``, which the app reads)."""
        kwargs = {
            f.name: f.value(values[f.name])
            for f in FLAGS
            if f.name not in _CANARY_FLAGS and f.name not in fields and values[f.name] is not None
        }
        if values["canary"] is not None:  # settings not given keep CanarySpec's defaults
            given = {name: values[f"canary_{name}"] for name in ("wait_seconds", "max_failure_rate")}
            kwargs["canary"] = CanarySpec.parse(
                values["canary"],
                watch_topics=split_list(values["canary_watch_topics"]) or (),
                **{name: value for name, value in given.items() if value is not None},
            )
        return cls(**{**kwargs, **fields})


@dataclass(frozen=True)
class Flag:
    """One option of the app's command line: the field (or canary setting) it sets and its value's kind."""

    name: str
    kind: str = "text"  # text, name, url, list, int, float, time, switch, mode, json
    metavar: str | None = None
    required: bool = False

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    def argparse_kwargs(self) -> dict[str, Any]:
        """``argparse.add_argument`` keywords: the type or choices, ``required`` and the help."""
        return {
            "help": _HELP[self.name],
            "required": self.required,
            "type": {"int": int, "float": float}.get(self.kind),
            "choices": {"switch": ("on", "off"), "mode": MODES}.get(self.kind),
            "metavar": self.metavar,
        }

    def value(self, text: Any) -> Any:
        """The field's value of the option's parsed argument ``text``."""
        kinds = {
            "name": str.strip,
            "url": lambda v: v.strip().rstrip("/"),
            "list": split_list,
            "time": lambda v: parse_time(v, self.option),
            "switch": lambda v: v == "on",
        }
        convert = kinds.get(self.kind)
        return convert(text) if convert else text

    def text(self, value: Any) -> str | None:
        """The option's argument for the field's ``value`` (``None``: left out)."""
        if value is None:
            return None
        if self.kind == "list":
            return ",".join(value)
        if self.kind == "time":
            return str(value.isoformat())
        if self.kind == "switch":
            return "on" if value else "off"
        if self.kind == "json":  # compact, keys sorted
            return json.dumps(value, sort_keys=True, separators=(",", ":"))
        return f"{value:g}" if isinstance(value, float) else str(value)


_CANARY_FLAGS = ("canary", "canary_wait_seconds", "canary_max_failure_rate", "canary_watch_topics")
#: The ``--help`` of each option.
_HELP = {
    "run_id": "Id of this run (e.g. the Airflow run id); re-use it to resume a run.",
    "mode": (
        "dry-run: decide and report only, change nothing (default). replay: republish, archive, drop, "
        "record and ack. archive-only: like replay but never republish (republish rules are skipped)."
    ),
    "service_url": "Pulsar binary service URL, e.g. pulsar://localhost:6650.",
    "topics": "DLQ topics to replay, comma-separated.",
    "subscription": f"Durable Shared subscription to read and ack through (default {DEFAULT_SUBSCRIPTION}).",
    "output_dir": (
        "Root for runs/<run_id>/, archive/ and ledger/: a local path or a URI pyarrow opens (s3://, "
        "s3a://, gs://, hdfs://); an object store needs --subscription-lease on."
    ),
    "auth_token_file": f"File holding the Pulsar JWT token (else env {TOKEN_ENV}; unset means no auth).",
    "tls_trust_certs_file": "CA bundle for pulsar+ssl:// service URLs.",
    "admin_url": (
        "Apache Pulsar admin REST, e.g. http://broker:8080 (same credentials and CA as the service). "
        "When it answers, each DLQ message is read once (Readers) and commit acks ids from the ledger; "
        "without it the DLQ is read twice through Shared consumers (the embedded broker's mode)."
    ),
    "tls_cert_file": (
        "Client certificate (PEM) for pulsar+ssl://: the authentication without a token or OAuth2 "
        "(AuthenticationTls), else mutual TLS. Needs --tls-key-file."
    ),
    "tls_key_file": "Private key (PEM) of --tls-cert-file.",
    "oauth2_issuer_url": "OAuth2 client credentials: the issuer URL.",
    "oauth2_audience": "OAuth2 audience (optional).",
    "oauth2_scope": "OAuth2 scope (optional).",
    "oauth2_credentials_file": (
        'OAuth2 key file {"client_id": ..., "client_secret": ...} '
        f"(else env {OAUTH2_CREDENTIALS_ENV} with the same JSON)."
    ),
    "playbook": "Playbook YAML (docs/playbook.md). Without it every message is skipped.",
    "origin_allowlist": (
        "Topics a message may be republished to (its origin must match): globs on full topic names "
        "(* within a path part, ** across), or re:<regex>. Required for --mode replay."
    ),
    "signatures": "Only act on these error signatures (from a report).",
    "error_class": "Only act on this error class (full or simple class name).",
    "since": "Only act on DLQ messages published at or after this time (UTC if no offset).",
    "until": "Only act on DLQ messages published before this time (UTC if no offset).",
    "max_messages": "Act on at most N messages (oldest first); the rest wait.",
    "max_replays": (
        "Loop guard: a message with REPLAY_COUNT >= N is archived instead of republished "
        f"(default {DEFAULT_MAX_REPLAYS})."
    ),
    "rate_limit": "Cap on republished messages per second (whole run).",
    "parallelism": (
        "Readers per DLQ partition for the snapshot (reader mode; default: enough to keep every core "
        "busy) and producers per origin topic (default: Spark's default parallelism)."
    ),
    "archive_payload": (
        "Archive payloads (on, default) or only their SHA-256 (off); playbooks can say off per rule."
    ),
    "group_actions": (
        "Approved action per error signature, overriding the playbook for this run: a JSON object "
        '{"<signature>": "replay"|"archive"|"leave"} or @path of a file holding it (docs/approval.md).'
    ),
    "window_from": (
        "Read the window frozen by this earlier run (e.g. the reviewed dry-run) instead of freezing a "
        "new one; same --output-dir, --topics and --subscription."
    ),
    "canary": (
        "Republish N messages (or P%%) of each error group first, watch them for --canary-wait-seconds "
        "and halt groups whose canaries fail again (left pending as canary_failed); docs/canary.md."
    ),
    "canary_wait_seconds": (
        f"How long the canary is watched before the rest is sent (default {DEFAULT_CANARY_WAIT_SECONDS:g})."
    ),
    "canary_max_failure_rate": (
        "Halt a group when more than this share of its canaries fail again (default 0: any)."
    ),
    "canary_watch_topics": (
        "Topics watched for failed canaries besides the DLQ topics and their -RETRY siblings."
    ),
    "wave_size": (
        "Republish in waves of N messages per producer, each saved before the next; after a kill a "
        "resumed run re-sends at most the wave in flight: N x producers messages, which reach the origin "
        f"twice on a broker without deduplication (default {DEFAULT_WAVE_SIZE}; {DEDUP_WAVE_SIZE} when the "
        "admin REST shows deduplication on every target topic, where a re-send is dropped by the broker)."
    ),
    "idle_timeout_ms": f"Stop reading a partition after this long idle (default {DEFAULT_IDLE_TIMEOUT_MS}).",
    "subscription_lease": (
        "Hold a broker lease per DLQ topic and subscription for the whole run, so no other replay "
        "(whatever its output dir) reads the same subscription at the same time (default on). It needs "
        "permission to consume a small lease topic in the DLQ's namespace; 'off' relies on the output "
        "directory lock alone, which only a local --output-dir can hold."
    ),
}
#: The app's command line, one entry per option, in ``--help`` and :meth:`ReplayOptions.to_argv` order.
FLAGS: tuple[Flag, ...] = (
    Flag("run_id", required=True),
    Flag("mode", "mode"),
    Flag("service_url", required=True),
    Flag("topics", "list", "T1,T2", required=True),
    Flag("subscription"),
    Flag("output_dir", "text", "URI", required=True),
    Flag("auth_token_file", "text", "PATH"),
    Flag("tls_trust_certs_file", "text", "PATH"),
    Flag("admin_url", "url", "URL"),
    Flag("tls_cert_file", "text", "PATH"),
    Flag("tls_key_file", "text", "PATH"),
    Flag("oauth2_issuer_url", "text", "URL"),
    Flag("oauth2_audience", "text", "AUDIENCE"),
    Flag("oauth2_scope", "text", "SCOPE"),
    Flag("oauth2_credentials_file", "text", "PATH"),
    Flag("playbook", "text", "PATH"),
    Flag("origin_allowlist", "list", "GLOB[,GLOB]"),
    Flag("signatures", "list", "S1,S2"),
    Flag("error_class", "name", "NAME"),
    Flag("since", "time", "ISO8601"),
    Flag("until", "time", "ISO8601"),
    Flag("max_messages", "int", "N"),
    Flag("max_replays", "int", "N"),
    Flag("rate_limit", "float", "MSGS_PER_S"),
    Flag("parallelism", "int", "N"),
    Flag("archive_payload", "switch"),
    Flag("group_actions", "json", "JSON|@FILE"),
    Flag("window_from", "name", "RUN_ID"),
    Flag("canary", "text", "N|P%"),
    Flag("canary_wait_seconds", "float", "S"),
    Flag("canary_max_failure_rate", "float", "RATE"),
    Flag("canary_watch_topics", "list", "T1,T2"),
    Flag("wave_size", "int", "N"),
    Flag("idle_timeout_ms", "int", "MS"),
    Flag("subscription_lease", "switch"),
)
