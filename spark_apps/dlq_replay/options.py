"""The library's :class:`~pulsar_dlq_consumer.replay_options.ReplayOptions`, plus the app's checks that keep a
misplaced secret out of files and logs, the compiled origin allowlist and the options a resume must keep."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pulsar_dlq_consumer import replay_options as contract
from pulsar_dlq_consumer.replay_options import ReplayOptionsError
from spark_apps.dlq_replay.errors import ReplayConfigError
from spark_apps.dlq_replay.redaction import check_name, check_url
from spark_apps.dlq_replay.topics import TopicMatcher

_HTTP = ("http://", "https://")
#: Option -> the schemes it takes, an example and what the URL is.
_URLS = {
    "--service-url": (("pulsar://", "pulsar+ssl://"), "pulsar://broker:6650", "binary-protocol URL"),
    "--admin-url": (_HTTP, "http://broker:8080", "admin REST URL"),
    "--oauth2-issuer-url": (_HTTP, "https://auth.example.com", "OAuth2 issuer URL"),
}


@dataclass(frozen=True)
class ReplayOptions(contract.ReplayOptions):
    """The run's options as the app uses them; every error is a :class:`ReplayConfigError`."""

    def __post_init__(self) -> None:
        try:
            super().__post_init__()
        except ReplayOptionsError as exc:
            raise ReplayConfigError(str(exc)) from None
        names = [
            ("--run-id", self.run_id),
            ("--window-from", self.window_from),
            ("--subscription", self.subscription),
        ]
        for option, name in names + [("--topics", topic) for topic in self.topics]:
            if name is not None:
                check_name(option, name)
        for option, rule in _URLS.items():
            url = getattr(self, option[2:].replace("-", "_"))
            if url is not None:  # no credentials, query or fragment
                check_url(option, url, *rule)
        self.allowlist_matcher()  # compiles every glob and regex now, naming a bad one

    def allowlist_matcher(self) -> TopicMatcher | None:
        """The compiled ``--origin-allowlist`` (``None`` when not given)."""
        return TopicMatcher.parse(list(self.origin_allowlist)) if self.origin_allowlist else None

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
