"""Canary replay with auto-halt, each stage saved in ``state.json`` before the next (``docs/canary.md``)."""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import TYPE_CHECKING, Any

from pyspark.sql import Window
from pyspark.sql import functions as F

from pulsar_dlq_consumer.topics import normalize_topic
from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay.lineage import REPLAY_ID, REPLAY_RUN_ID
from spark_apps.dlq_replay.progress import waiting
from spark_apps.dlq_replay.pulsar_io.conf import get_client
from spark_apps.dlq_replay.pulsar_io.source import ddl_struct
from spark_apps.dlq_replay.pulsar_io.window import expand_partitions
from spark_apps.dlq_replay.schemas import RESULTS_SCHEMA
from spark_apps.dlq_replay.storage import join
from spark_apps.dlq_replay.task_parquet import read_frame, write_frame
from spark_apps.dlq_replay.task_sends import SendFilter

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame

    from pulsar_dlq_consumer.replay_options import CanarySpec
    from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf

log = logging.getLogger("spark_apps.dlq_replay")
CANARY_WAVE = -1  # results saved under apply/republish/wave=-1
#: The canary rows, saved before they are sent (``runs/<run>/canary_ids/``).
CANARY_IDS_SCHEMA = ddl_struct("replay_id string, signature string")
#: The reason of a halted group's messages left pending.
HALTED_REASON = "halted: the group's canary failed again in the consumer"
#: Read the watched topics from this long before the canary was sent (broker and driver clocks differ);
#: matching on REPLAY_ID and REPLAY_RUN_ID keeps older messages out.
CLOCK_MARGIN_MS = 120_000
_VERDICT_LINE = "canary: group %s: %d sent, %d failed again (rate %.2f, max %.2f) -> %s"


def canary_selection(decisions: DataFrame, spec: CanarySpec) -> DataFrame:
    """The canary rows (``replay_id``, ``signature``): each group's first messages to republish."""
    order = Window.partitionBy("signature").orderBy("publish_time", "dlq_topic", "replay_id")
    group = Window.partitionBy("signature")
    if spec.percent is not None:
        size = F.greatest(F.lit(1), F.ceil(F.count(F.lit(1)).over(group) * F.lit(spec.percent / 100.0)))
    else:
        size = F.lit(int(spec.count or 0))
    ranked = decisions.filter(F.col("outcome") == F.lit(oc.TO_REPUBLISH)).select(
        "replay_id", "signature", (F.row_number().over(order) <= size).alias("_canary")
    )
    return ranked.filter("_canary").drop("_canary")


def watched_topics(dlq_topics: tuple[str, ...], spec: CanarySpec) -> list[str]:
    """The DLQ topics, their ``-RETRY`` siblings and the extra watch topics (full names, no duplicates)."""
    names: list[str] = []
    for full in map(normalize_topic, dlq_topics):
        names += [full, full.removesuffix("-DLQ") + "-RETRY"] if full.endswith("-DLQ") else [full]
    names += map(normalize_topic, spec.watch_topics)
    return list(dict.fromkeys(names))


def derived_retry_topics(topics: list[str], spec: CanarySpec) -> frozenset[str]:
    """The watched ``-RETRY`` siblings not named in the watch topics: they may not exist (a warning)."""
    named = set(map(normalize_topic, spec.watch_topics))
    return frozenset(t for t in topics if t.endswith("-RETRY") and t not in named)


def failed_again(
    conf: PulsarConf, topics: list[str], since_ms: int, run_id: str, ids: set[str], optional: frozenset[str]
) -> set[str]:
    """The canary ``ids`` back on ``topics`` since ``since_ms`` (read, not acked; ``optional`` may fail)."""
    import pulsar  # the driver's alone: record tasks import this module too

    client = get_client(conf)
    until_ms = int(time.time() * 1000)
    seen: set[str] = set()
    read = 0
    for topic in topics:
        maybe = topic in optional
        for name, _ in _watched(partial(expand_partitions, client), topic, maybe, []):
            reader = _watched(lambda n: client.create_reader(n, pulsar.MessageId.latest), name, maybe, None)
            if reader is None:
                continue
            try:
                reader.seek(int(since_ms))
                read += _read_canaries(reader, until_ms, run_id, ids, seen)
            finally:
                reader.close()
    log.info("canary: read %d messages on %d watched topics; %d failed again", read, len(topics), len(seen))
    return seen


def _watched(open_: Callable[[str], Any], name: str, optional: bool, missing: Any) -> Any:
    """``open_(name)``; ``missing``, with a warning, when it fails for an ``optional`` (derived) topic."""
    try:
        return open_(name)
    except Exception as exc:
        if not optional:
            raise
        log.warning("canary: %s is not watched (%s)", name, type(exc).__name__)
        return missing


def _read_canaries(reader: Any, until_ms: int, run_id: str, canary_ids: set[str], seen: set[str]) -> int:
    """Read until idle or past ``until_ms``, adding this run's canary ids to ``seen``; the messages read."""
    import pulsar

    read = 0
    while True:
        try:
            msg = reader.read_next(timeout_millis=3000)
        except pulsar.Timeout:
            return read
        read += 1
        props = msg.properties()
        if props.get(REPLAY_RUN_ID) == run_id and props.get(REPLAY_ID) in canary_ids:
            seen.add(props[REPLAY_ID])
        if msg.publish_timestamp() > until_ms:
            return read


def verdicts(sent: dict[str, list[str]], seen: set[str], spec: CanarySpec) -> dict[str, dict[str, Any]]:
    """Per group: canaries sent, failed again, the rate and the decision (no canary published: halted)."""
    out: dict[str, dict[str, Any]] = {}
    for signature, ids in sorted(sent.items()):
        failed = len(set(ids) & seen)
        rate = failed / len(ids) if ids else 1.0  # none published: above any allowed rate (< 1), halted
        decision = "halted" if rate > spec.max_failure_rate else "replay"
        out[signature] = dict(
            canary_sent=len(ids), failed_again=failed, failure_rate=round(rate, 4), decision=decision
        )
    return out


def run_canary(run: Any, decisions: DataFrame, send: Callable[[str, SendFilter], None]) -> list[str]:
    """Send the canary (``send(path, chosen)``), wait, judge each group; the halted groups."""
    spec: CanarySpec = run.options.canary
    state = run.state.progress("apply").setdefault("canary", {})
    ids_path = run.paths.canary_ids
    path = join(run.paths.republish_results, f"wave={CANARY_WAVE}")
    if "watch_from_ms" not in state:
        state["watch_from_ms"] = int(time.time() * 1000) - CLOCK_MARGIN_MS
        run.save()
    if not run.storage.exists(join(path, "_SUCCESS")):
        log.info("canary: republishing %s messages of each group first", spec.label)
        if not run.storage.exists(join(ids_path, "_SUCCESS")):
            write_frame(canary_selection(decisions, spec), ids_path, CANARY_IDS_SCHEMA)
        send(path, SendFilter(ids_path, canary=True))
        state.pop("sent_at", None)
    else:
        log.info("canary: sent by an earlier attempt, not sending again")
    if "sent_at" not in state:
        state["sent_at"] = time.time()
        run.save()
    if "verdicts" not in state:
        remaining = float(state["sent_at"]) + spec.wait_seconds - time.time()
        if remaining > 0:
            log.info("canary: watching for re-failures for %.0f s", remaining)
            with waiting("canary watch", remaining):
                time.sleep(remaining)
        canaries = read_frame(run.spark, ids_path, CANARY_IDS_SCHEMA)  # a few per group
        published = read_frame(run.spark, path, RESULTS_SCHEMA).select("replay_id", "published")
        ok_ids = F.collect_list(F.when(F.col("published"), F.col("replay_id"))).alias("ids")
        rows = canaries.join(published, on="replay_id", how="left").groupBy("signature").agg(ok_ids).collect()
        sent = {r["signature"]: list(r["ids"]) for r in rows}
        topics = watched_topics(tuple(run.options.topics), spec)
        canary_ids = {i for ids in sent.values() for i in ids}
        derived = derived_retry_topics(topics, spec)
        since = int(state["watch_from_ms"])
        seen = failed_again(run.conf, topics, since, run.options.run_id, canary_ids, derived)
        state["watched_topics"] = topics
        state["verdicts"] = verdicts(sent, seen, spec)
        run.save()
        for signature, v in state["verdicts"].items():
            counts = (v["canary_sent"], v["failed_again"], v["failure_rate"], spec.max_failure_rate)
            log.info(_VERDICT_LINE, signature, *counts, v["decision"])
    return halted_groups(run)


def unsent_halted(run: Any, decisions: DataFrame, halted: list[str]) -> int:
    """Messages of halted groups that were not sent (``canary_failed``): all but their canaries."""
    if not halted:
        return 0
    in_halted = F.col("signature").isin(*halted)
    to_send = decisions.filter((F.col("outcome") == F.lit(oc.TO_REPUBLISH)) & in_halted).count()
    return to_send - read_frame(run.spark, run.paths.canary_ids, CANARY_IDS_SCHEMA).filter(in_halted).count()


def halted(verdicts: dict[str, dict[str, Any]]) -> list[str]:
    """The groups whose :func:`verdicts` halted them, sorted."""
    return sorted(s for s, v in verdicts.items() if v.get("decision") == "halted")


def halted_groups(run: Any) -> list[str]:
    """The groups the canary halted in this run (from ``state.json``)."""
    return halted((run.state.info("apply").get("canary") or {}).get("verdicts") or {})
