"""The replay run's options: one validated, immutable object built by the CLI (or by tests directly)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay.errors import ReplayConfigError
from spark_apps.dlq_replay.redaction import check_name, check_url, shown
from spark_apps.dlq_replay.state import validate_run_id

if TYPE_CHECKING:
    from spark_apps.dlq_replay.canary import CanarySpec
    from spark_apps.dlq_replay.topics import TopicMatcher

DEFAULT_SUBSCRIPTION = "dlq-replayer"
DEFAULT_MAX_REPLAYS = 3
DEFAULT_IDLE_TIMEOUT_MS = 3000
#: Sequence ids per producer and wave: after a kill mid-apply a resumed run re-sends at most one wave per
#: producer (see ``docs/reliability.md`` for the bound and the measured cost of smaller waves).
DEFAULT_WAVE_SIZE = 2_000
#: The wave size when the admin REST shows broker deduplication on every target topic: a re-sent wave is
#: dropped by the broker there, so only the time to send it again is at stake, and fewer waves cost less.
DEDUP_WAVE_SIZE = 50_000
_SIGNATURE = re.compile(r"[0-9a-f]{16}")
_SERVICE_SCHEMES = ("pulsar://", "pulsar+ssl://")
_HTTP_SCHEMES = ("http://", "https://")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def parse_time(value: str, option: str) -> datetime:
    """ISO 8601 date or date-time; without an offset it is taken as UTC."""
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError as exc:
        raise ReplayConfigError(
            f"{option} is not an ISO 8601 date or time (value not shown); use e.g. 2024-05-01 or "
            "2024-05-01T12:00:00+00:00"
        ) from exc
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def split_list(value: str | None) -> tuple[str, ...] | None:
    """``"a, b,,c"`` -> ``("a", "b", "c")``; ``None``/empty -> ``None``."""
    if value is None:
        return None
    items = tuple(p.strip() for p in value.split(",") if p.strip())
    return items or None


def _check_run_name(option: str, value: str) -> None:
    """A run id given to ``option`` (``--run-id``, ``--window-from``): a valid id and a safe name."""
    try:
        validate_run_id(value)
    except ValueError as exc:
        raise ReplayConfigError(f"{option}: {exc}") from exc
    check_name(option, value)


#: The numeric options with a lower bound: (option, attribute, minimum); ``None`` means not given.
_MINIMUMS: tuple[tuple[str, str, int], ...] = (
    ("--max-messages", "max_messages", 1),
    ("--max-replays", "max_replays", 1),
    ("--parallelism", "parallelism", 1),
    ("--idle-timeout-ms", "idle_timeout_ms", 100),
    ("--wave-size", "wave_size", 1),
)


@dataclass(frozen=True)
class ReplayOptions:
    """Everything a replay run needs (see ``--help`` of the CLI for each option)."""

    run_id: str
    output_dir: str
    service_url: str
    topics: tuple[str, ...]
    mode: str = oc.DRY_RUN
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
    #: ``None``: :data:`DEFAULT_WAVE_SIZE`, or :data:`DEDUP_WAVE_SIZE` under broker deduplication.
    wave_size: int | None = None
    subscription_lease: bool = True
    #: Approved action per error signature (``--group-actions``), overriding the playbook for this run.
    group_actions: dict[str, str] | None = None
    #: Read the window frozen by this earlier run (``--window-from``), e.g. the reviewed dry-run.
    window_from: str | None = None
    #: Replay a canary of each group first and halt groups that fail again (``--canary``).
    canary: CanarySpec | None = None
    admin_url: str | None = None

    def __post_init__(self) -> None:
        _check_run_name("--run-id", self.run_id)
        if self.mode not in oc.MODES:
            raise ReplayConfigError(f"--mode must be one of {', '.join(oc.MODES)}; got {self.mode!r}")
        if not self.output_dir or not self.output_dir.strip():
            raise ReplayConfigError(
                "--output-dir is required (a local path or a Hadoop URI such as s3a://bucket/dlq)"
            )
        self._check_urls()
        self._check_topics()
        self._check_subscription()
        self._check_origin_allowlist()
        self._check_selection()
        self._check_limits()
        self._check_window_from()

    def _check_subscription(self) -> None:
        if not self.subscription or not self.subscription.strip() or _CONTROL.search(self.subscription):
            raise ReplayConfigError(
                "--subscription must be a non-empty name without control characters (default dlq-replayer)"
            )
        check_name("--subscription", self.subscription)

    def _check_origin_allowlist(self) -> None:
        if self.mode == oc.REPLAY and not self.origin_allowlist:
            raise ReplayConfigError(
                "--origin-allowlist is required in replay mode: the topics a message may be republished to, "
                "as globs (persistent://public/default/orders*) or regexes (re:...), comma-separated"
            )
        if self.origin_allowlist:
            self.allowlist_matcher()  # compiles every glob and regex now, naming a bad one

    def _check_selection(self) -> None:
        """``--signatures``, ``--error-class``, ``--since`` and ``--until``: which messages are read."""
        for signature in self.signatures or ():
            if not _SIGNATURE.fullmatch(signature):
                raise ReplayConfigError(
                    f"--signatures: {shown(signature)} is not a signature; signatures are 16 lower-case hex "
                    "digits, as in the `signature` of a report group (e.g. 3f1c9a0b2d4e6f81)"
                )
        if self.error_class is not None and not self.error_class:
            raise ReplayConfigError("--error-class must not be empty; give a class name such as ValueError")
        if self.since and self.until and self.since >= self.until:
            raise ReplayConfigError(
                f"--since ({self.since.isoformat()}) must be before --until ({self.until.isoformat()})"
            )

    def _check_limits(self) -> None:
        """The numeric options: each at least its minimum (:data:`_MINIMUMS`), a rate above zero."""
        for name, attribute, minimum in _MINIMUMS:
            value = getattr(self, attribute)
            if value is not None and value < minimum:
                raise ReplayConfigError(f"{name} must be >= {minimum}; got {value}")
        if self.rate_limit is not None and self.rate_limit <= 0:
            raise ReplayConfigError(f"--rate-limit must be > 0 messages/s; got {self.rate_limit}")

    def _check_window_from(self) -> None:
        if self.window_from is None:
            return
        _check_run_name("--window-from", self.window_from)
        if self.window_from == self.run_id:
            raise ReplayConfigError("--window-from must name an earlier run, not this --run-id")

    def _check_urls(self) -> None:
        """The URLs carry no credentials, query or fragment (:func:`~.redaction.check_url`)."""
        if not self.service_url:
            raise ReplayConfigError("--service-url is required, e.g. pulsar://broker:6650")
        check_url(
            "--service-url", self.service_url, _SERVICE_SCHEMES, "pulsar://broker:6650", "binary-protocol URL"
        )
        if self.admin_url is not None:
            check_url("--admin-url", self.admin_url, _HTTP_SCHEMES, "http://broker:8080", "admin REST URL")
        if self.oauth2_issuer_url is not None:
            check_url(
                "--oauth2-issuer-url",
                self.oauth2_issuer_url,
                _HTTP_SCHEMES,
                "https://auth.example.com",
                "OAuth2 issuer URL",
            )

    def _check_topics(self) -> None:
        if not self.topics:
            raise ReplayConfigError("--topics is required: the DLQ topics to replay, comma-separated")
        from spark_apps.dlq_replay.pulsar_io.errors import PulsarConfigError
        from spark_apps.dlq_replay.pulsar_io.window import parse_topics

        for topic in self.topics:
            check_name("--topics", topic)
        try:
            parse_topics(list(self.topics))
        except PulsarConfigError as exc:
            raise ReplayConfigError(f"--topics: {exc}") from exc

    def allowlist_matcher(self) -> TopicMatcher | None:
        """The compiled ``--origin-allowlist`` (``None`` when not given)."""
        if not self.origin_allowlist:
            return None
        from spark_apps.dlq_replay.topics import TopicMatcher

        return TopicMatcher.parse(list(self.origin_allowlist))

    def fingerprint_options(self, playbook_digest: str) -> dict[str, Any]:
        """The options that shape results: a run id must be resumed with the same ones."""
        return {
            "mode": self.mode,
            "topics": list(self.topics),
            "subscription": self.subscription,
            "playbook_sha256": playbook_digest,
            "origin_allowlist": list(self.origin_allowlist or []),
            "signatures": list(self.signatures) if self.signatures else None,
            "error_class": self.error_class,
            "since": self.since.isoformat() if self.since else None,
            "until": self.until.isoformat() if self.until else None,
            "max_messages": self.max_messages,
            "max_replays": self.max_replays,
            "archive_payload": self.archive_payload,
            "wave_size": self.wave_size,
            # Only when given, so runs started without them keep their fingerprint.
            **({"group_actions": dict(sorted(self.group_actions.items()))} if self.group_actions else {}),
            **({"window_from": self.window_from} if self.window_from else {}),
            **({"canary": self.canary.fingerprint()} if self.canary else {}),
        }
