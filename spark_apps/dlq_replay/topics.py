"""The origin allowlist (origin topics come from untrusted message properties); what a topic name is and
where a replayed message goes are the library's rules (``pulsar_dlq_consumer.context.canonical_topic``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from spark_apps.dlq_replay.errors import ReplayConfigError

_GLOB_TOKEN = re.compile(r"\*\*|\*|\?|[^*?]+")
#: A topic glob's tokens: ``*`` = any characters except ``/``, ``**`` = any characters, ``?`` = one.
_GLOB_REGEX = {"**": ".*", "*": "[^/]*", "?": "[^/]"}
_GLOB_PREFIX = {0: "persistent://public/default/", 2: "persistent://"}


def _qualify_glob(glob: str, what: str) -> str:
    """Qualify a glob like a topic name; one starting with ``**`` is used as it is."""
    if "://" in glob or glob.startswith("**"):
        return glob
    prefix = _GLOB_PREFIX.get(glob.count("/"))
    if prefix is not None:
        return prefix + glob
    raise ReplayConfigError(
        f"{what}: pattern {glob!r} must look like a topic name: <topic>, <tenant>/<namespace>/<topic>, "
        "persistent://<tenant>/<namespace>/<topic>, or start with ** (any prefix)"
    )


@dataclass(frozen=True)
class TopicMatcher:
    """A list of globs (``re:`` prefix for a regex) matched against fully qualified topic names."""

    patterns: tuple[str, ...]
    compiled: tuple[re.Pattern[str], ...]

    @classmethod
    def parse(cls, patterns: list[str], *, what: str = "--origin-allowlist") -> TopicMatcher:
        """Compile ``patterns``; globs without ``://`` are qualified like topic names."""
        compiled: list[re.Pattern[str]] = []
        for raw in patterns:
            pattern = raw.strip()
            if not pattern:
                raise ReplayConfigError(f"{what}: empty pattern in {patterns!r}; remove the extra comma")
            if pattern.startswith("re:"):
                regex = pattern[3:]
            else:
                tokens = _GLOB_TOKEN.findall(_qualify_glob(pattern, what))
                regex = "".join(_GLOB_REGEX.get(t) or re.escape(t) for t in tokens)
            try:  # a translated glob always compiles
                compiled.append(re.compile(regex))
            except re.error as exc:
                raise ReplayConfigError(
                    f"{what}: invalid regular expression {regex!r}: {exc}; fix the pattern"
                ) from exc
        return cls(tuple(p.strip() for p in patterns), tuple(compiled))

    def matches(self, topic: str | None) -> bool:
        """True if the qualified ``topic`` fully matches one of the patterns."""
        return bool(topic and any(p.fullmatch(topic) for p in self.compiled))
