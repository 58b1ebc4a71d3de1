"""The contenders of the benchmark.

Single-process contenders (``ceiling``, ``handwritten``, ``tuned``) run in their own Python process,
``python -m bench.contenders NAME SPEC_JSON``, so that their memory is measured alone and no client
state is shared with the harness; ``ours`` submits the Spark replay app with ``spark-submit``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class ContenderSpec:
    """What a single-process contender is told: where the DLQs are and how many messages to expect."""

    service_url: str
    dlq_topics: tuple[str, ...]
    backlog: tuple[int, ...]
    subscription: str
    archive_path: str
    idle_timeout_s: float = 60.0
    #: Contender-specific knobs (the ceiling's :class:`~bench.contenders.ceiling.CeilingSettings`).
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def expected(self) -> int:
        return sum(self.backlog)

    def topics(self) -> list[tuple[str, int]]:
        """``(DLQ topic, pending messages)`` pairs, as a user reads them from topic stats."""
        return list(zip(self.dlq_topics, self.backlog, strict=True))

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["dlq_topics"] = list(self.dlq_topics)
        data["backlog"] = list(self.backlog)
        return data

    @classmethod
    def from_json(cls, data: dict[str, object]) -> ContenderSpec:
        topics = data.get("dlq_topics")
        backlog = data.get("backlog")
        if not isinstance(topics, list) or not isinstance(backlog, list) or len(topics) != len(backlog):
            raise ValueError(
                f"spec needs dlq_topics and backlog lists of equal length; got {topics!r}, {backlog!r}"
            )
        return cls(
            service_url=str(data["service_url"]),
            dlq_topics=tuple(str(t) for t in topics),
            backlog=tuple(int(str(b)) for b in backlog),
            subscription=str(data["subscription"]),
            archive_path=str(data["archive_path"]),
            idle_timeout_s=float(str(data.get("idle_timeout_s", 60.0))),
            settings=dict(data.get("settings") or {}),  # type: ignore[call-overload]
        )


#: Marker of the one result line a contender process prints on stdout.
RESULT_MARKER = "BENCH_RESULT "
SINGLE_PROCESS = ("ceiling", "handwritten", "tuned")
