"""Backlog reading logic (pure): Prometheus parsing, admin stats, pattern expansion, error mapping."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from airflow_provider_dlq.hooks import backlog as backlog_module
from airflow_provider_dlq.hooks.backlog import (
    AdminHttp,
    BacklogConfigError,
    BacklogReadError,
    TopicBacklog,
    admin_backlog,
    metrics_backlog,
    parse_prometheus_backlog,
    prepare_topics,
)

SUB = "dlq-replayer"


def sample(value, **labels):
    """One Prometheus sample line of the backlog gauge."""
    body = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"pulsar_subscription_back_log{{{body}}} {value}"


LITE = {"cluster": "pulsar-lite", "partition": "-1"}
PULSAR_LITE = "\n".join(
    [
        "# HELP pulsar_subscription_back_log Unacknowledged stored entries",
        "# TYPE pulsar_subscription_back_log gauge",
        sample(5, **LITE, namespace="public/default", subscription="dlq-replayer", topic="orders-DLQ"),
        sample(99, **LITE, namespace="public/default", subscription="other", topic="orders-DLQ"),
        sample(0, **LITE, namespace="acme/pay", subscription="dlq-replayer", topic="pay-DLQ"),
        "pulsar_broker_msg_backlog 104",
    ]
)

APACHE_NS = {"cluster": "standalone", "namespace": "acme/orders"}
APACHE = "\n".join(
    [
        "# TYPE pulsar_subscription_back_log gauge",
        sample(
            "3 1700000000000",
            **APACHE_NS,
            topic="persistent://acme/orders/a-DLQ-partition-0",
            subscription=SUB,
        ),
        sample(
            "4.0 1700000000000",
            **APACHE_NS,
            topic="persistent://acme/orders/a-DLQ-partition-1",
            subscription=SUB,
        ),
        sample(1, **APACHE_NS, topic="persistent://acme/orders/b-DLQ", subscription=SUB),
        sample(8, **APACHE_NS, topic="non-persistent://acme/orders/x", subscription=SUB),
        sample(2, **APACHE_NS, topic='persistent://acme/orders/q\\"x', subscription=SUB),
    ]
)


def fake_get(responses):
    """An ``AdminHttp`` serving canned responses by URL (``"POST <url>"`` for posts), recording the calls.

    A response that is an exception is raised, as the hook raises a failed request.
    """
    calls = []

    class Fake(AdminHttp):
        def send(self, url, method="GET"):
            key = url if method == "GET" else f"{method} {url}"
            calls.append(key)
            if key not in responses:
                return 404, "not found"
            if isinstance(responses[key], Exception):
                raise responses[key]
            status, body = responses[key]
            return status, body if isinstance(body, str) else json.dumps(body)

    return Fake(), calls


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("orders-DLQ", "persistent://public/default/orders-DLQ"),
        ("acme/orders/x-DLQ", "persistent://acme/orders/x-DLQ"),
        (" persistent://acme/orders/x ", "persistent://acme/orders/x"),
    ],
)
def test_normalize_topic(given, expected):
    assert prepare_topics([given]) == [expected]


@pytest.mark.parametrize(
    ("given", "fragment"),
    [
        ("non-persistent://a/b/c", "is not persistent"),
        ("a/b", "not a valid topic name"),
        ("", "Empty topic name"),
    ],
)
def test_bad_topic_names_say_how_to_write_them(given, fragment):
    with pytest.raises(BacklogConfigError, match=fragment):
        prepare_topics([given])


def test_patterns_allow_wildcards_only_in_the_topic_part():
    assert prepare_topics(["acme/orders/*-DLQ", "x", "x"]) == [
        "persistent://acme/orders/*-DLQ",
        "persistent://public/default/x",
    ]
    with pytest.raises(BacklogConfigError, match="only in the topic name"):
        prepare_topics(["persistent://acme/*/x"])
    with pytest.raises(BacklogConfigError, match="No topics given"):
        prepare_topics([])


def test_prometheus_pulsar_lite_labels():
    assert parse_prometheus_backlog(PULSAR_LITE, SUB) == {
        "persistent://public/default/orders-DLQ": 5,
        "persistent://acme/pay/pay-DLQ": 0,
    }


def test_prometheus_apache_labels_sum_partitions_and_skip_non_persistent():
    assert parse_prometheus_backlog(APACHE, SUB) == {
        "persistent://acme/orders/a-DLQ": 7,
        "persistent://acme/orders/b-DLQ": 1,
        'persistent://acme/orders/q"x': 2,
    }


def test_metrics_plan_reports_missing_topics_and_expands_patterns():
    get, calls = fake_get({"http://m/metrics": (200, APACHE)})
    topics = prepare_topics(["persistent://acme/orders/*-DLQ", "acme/orders/missing-DLQ"])
    result = metrics_backlog(get, "http://m/metrics", topics, SUB)
    assert calls == ["http://m/metrics"]
    a_dlq, b_dlq = "persistent://acme/orders/a-DLQ", "persistent://acme/orders/b-DLQ"
    assert result == {
        a_dlq: TopicBacklog(a_dlq, SUB, 7, "metrics", True),
        b_dlq: TopicBacklog(b_dlq, SUB, 1, "metrics", True),
        "persistent://acme/orders/missing-DLQ": TopicBacklog(
            "persistent://acme/orders/missing-DLQ", SUB, 0, "metrics", False
        ),
    }


def test_metrics_plan_errors_name_the_extra():
    get, _ = fake_get({"http://m/metrics": (503, "down")})
    with pytest.raises(BacklogReadError, match="HTTP 503; check the extra 'metrics_url'"):
        metrics_backlog(get, "http://m/metrics", ["persistent://public/default/x"], SUB)
    get, _ = fake_get({"http://m/metrics": (200, "<html>login</html>")})
    with pytest.raises(BacklogReadError, match="does not look like a Prometheus metrics page"):
        metrics_backlog(get, "http://m/metrics", ["persistent://public/default/x"], SUB)


ADMIN = "http://admin:8080"
NOW_MS = 1_700_000_100_000


def test_admin_plan_reads_stats_partitioned_stats_and_ages():
    base = f"{ADMIN}/admin/v2/persistent/acme/orders"

    def part(i, entries):
        return {"subscriptions": {SUB: {"msgBacklog": entries}}}

    get, calls = fake_get(
        {
            base: (
                200,
                [
                    "persistent://acme/orders/a-DLQ-partition-0",
                    "persistent://acme/orders/a-DLQ-partition-1",
                    "persistent://acme/orders/a-DLQ-partition-2",
                    "persistent://acme/orders/b-DLQ",
                    "persistent://acme/orders/live",
                ],
            ),
            f"{base}/a-DLQ/partitions": (200, {"partitions": 3}),
            f"{base}/a-DLQ/partitioned-stats?perPartition=true&getEarliestTimeInBacklog=true": (
                200,
                {
                    "subscriptions": {
                        SUB: {"msgBacklog": 7, "earliestMsgPublishTimeInBacklog": NOW_MS - 90e3}
                    },
                    "partitions": {
                        "persistent://acme/orders/a-DLQ-partition-0": part(0, 3),
                        "persistent://acme/orders/a-DLQ-partition-1": part(1, 4),
                        "persistent://acme/orders/a-DLQ-partition-2": part(2, 0),
                    },
                },
            ),
            # batched: 3 entries hold 30 messages, 4 entries hold 4 (partition 2 is empty: not asked)
            f"POST {base}/a-DLQ-partition-0/subscription/{SUB}/analyzeBacklog": (
                200,
                {"entries": 3, "messages": 30, "aborted": False},
            ),
            f"POST {base}/a-DLQ-partition-1/subscription/{SUB}/analyzeBacklog": (
                200,
                {"entries": 4, "messages": 4, "aborted": False},
            ),
            f"{base}/b-DLQ/partitions": (200, {"partitions": 0}),
            f"{base}/b-DLQ/stats?getEarliestTimeInBacklog=true": (
                200,
                {"subscriptions": {"someone-else": {"msgBacklog": 3}}},
            ),
            f"{base}/c%3ADLQ/partitions": (200, {"partitions": 0}),
            f"{base}/c%3ADLQ/stats?getEarliestTimeInBacklog=true": (
                200,
                {"subscriptions": {SUB: {"msgBacklog": 0, "earliestMsgPublishTimeInBacklog": 0}}},
            ),
        }
    )
    topics = prepare_topics(["persistent://acme/orders/*-DLQ", "acme/orders/c:DLQ"])
    result = admin_backlog(get, ADMIN, topics, SUB, now_ms=NOW_MS)
    assert calls[0] == base
    assert f"POST {base}/a-DLQ-partition-2/subscription/{SUB}/analyzeBacklog" not in calls
    assert result["persistent://acme/orders/a-DLQ"] == TopicBacklog(
        "persistent://acme/orders/a-DLQ", SUB, 34, "admin", True, 90.0, entries=7, exact=True
    )
    assert result["persistent://acme/orders/b-DLQ"] == TopicBacklog(
        "persistent://acme/orders/b-DLQ", SUB, 0, "admin", False
    )
    assert result["persistent://acme/orders/c:DLQ"] == TopicBacklog(
        "persistent://acme/orders/c:DLQ", SUB, 0, "admin", True, None, entries=0, exact=True
    )
    assert "persistent://acme/orders/live" not in result
    assert not any(c.startswith("POST") and "c%3ADLQ" in c for c in calls)  # nothing to count


T = "persistent://a/b/t"
T_BASE = f"{ADMIN}/admin/v2/persistent/a/b/t"
T_STATS = f"{T_BASE}/stats?getEarliestTimeInBacklog=true"
T_COUNT = f"POST {T_BASE}/subscription/{SUB}/analyzeBacklog"


@pytest.mark.parametrize(
    ("count_response", "expected"),
    [
        ((200, {"entries": 5, "messages": 50, "aborted": False}), (50, True)),
        # the broker stopped early: unread entries count as one message each (a lower bound)
        ((200, {"entries": 2, "messages": 20, "aborted": True}), (23, False)),
        ((405, "Method Not Allowed"), (5, False)),  # a broker without analyzeBacklog
        ((403, ""), (5, False)),  # a token that may read stats but not scan
        ((200, "<html/>"), (5, False)),
        ((200, {"messages": "many"}), (5, False)),
        (BacklogReadError("POST timed out"), (5, False)),  # a slow scan never fails the read
    ],
)
def test_admin_plan_counts_batched_messages_or_falls_back_to_entries(count_response, expected):
    get, calls = fake_get(
        {
            f"{T_BASE}/partitions": (200, {"partitions": 0}),
            T_STATS: (200, {"subscriptions": {SUB: {"msgBacklog": 5}}}),
            T_COUNT: count_response,
        }
    )
    result = admin_backlog(get, ADMIN, [T], SUB, now_ms=NOW_MS)
    assert (result[T].backlog, result[T].exact, result[T].entries) == (*expected, 5)
    assert calls[-1] == T_COUNT


def test_admin_plan_does_not_scan_a_large_backlog(monkeypatch):
    get, calls = fake_get(
        {
            f"{T_BASE}/partitions": (200, {"partitions": 0}),
            T_STATS: (200, {"subscriptions": {SUB: {"msgBacklog": 10_001}}}),
        }
    )
    result = admin_backlog(get, ADMIN, [T], SUB, now_ms=NOW_MS)
    assert (result[T].backlog, result[T].exact) == (10_001, False)
    assert T_COUNT not in calls
    get, calls = fake_get(
        {
            f"{T_BASE}/partitions": (200, {"partitions": 0}),
            T_STATS: (200, {"subscriptions": {SUB: {"msgBacklog": 3}}}),
        }
    )
    monkeypatch.setattr(backlog_module, "COUNT_MAX_ENTRIES", 2)
    result = admin_backlog(get, ADMIN, [T], SUB, now_ms=NOW_MS)
    assert (result[T].backlog, result[T].exact) == (3, False)
    assert T_COUNT not in calls


def test_a_failed_stats_read_still_fails():
    get, _ = fake_get({f"{T_BASE}/partitions": BacklogReadError("GET refused")})
    with pytest.raises(BacklogReadError, match="GET refused"):
        admin_backlog(get, ADMIN, [T], SUB, now_ms=NOW_MS)


def test_admin_plan_missing_topic_is_not_found_and_auth_errors_say_how_to_fix():
    get, _ = fake_get({})
    result = admin_backlog(get, ADMIN, ["persistent://a/b/gone"], SUB, now_ms=NOW_MS)
    assert result == {"persistent://a/b/gone": TopicBacklog("persistent://a/b/gone", SUB, 0, "admin", False)}

    get, _ = fake_get({f"{ADMIN}/admin/v2/persistent/a/b/t/partitions": (401, "")})
    with pytest.raises(BacklogConfigError, match=r"HTTP 401\); the connection's token"):
        admin_backlog(get, ADMIN, ["persistent://a/b/t"], SUB, now_ms=NOW_MS)

    get, _ = fake_get({f"{ADMIN}/admin/v2/persistent/a/b/t/partitions": (500, "boom")})
    with pytest.raises(BacklogReadError, match="HTTP 500; check the extra 'admin_url'"):
        admin_backlog(get, ADMIN, ["persistent://a/b/t"], SUB, now_ms=NOW_MS)

    get, _ = fake_get({f"{ADMIN}/admin/v2/persistent/a/b/t/partitions": (200, "<html/>")})
    with pytest.raises(BacklogReadError, match="did not return JSON"):
        admin_backlog(get, ADMIN, ["persistent://a/b/t"], SUB, now_ms=NOW_MS)


def test_topic_backlog_round_trips_through_json():
    item = TopicBacklog("persistent://a/b/c", SUB, 40, "admin", True, 12.5, entries=4, exact=True)
    assert TopicBacklog(**json.loads(json.dumps(asdict(item)))) == item


def test_admin_http_sends_the_token_and_posts_no_body(http_server):
    """The admin API refuses a POST with a form body (HTTP 415); a failed request names the URL only."""
    from http.server import BaseHTTPRequestHandler

    seen = []

    class Answers(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            seen.append(dict(self.headers))
            self.send_response(404)
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"gone")

    url = f"{http_server(Answers)}/analyzeBacklog"
    assert AdminHttp(None, "tok-1", 5).send(url, "POST") == (404, "gone")
    assert seen[0]["Authorization"] == "Bearer tok-1"
    assert seen[0]["Content-Length"] == "0"
    assert "Content-Type" not in seen[0]
    assert "tok-1" not in repr(AdminHttp(None, "tok-1"))
    with pytest.raises(BacklogReadError, match=r"^GET http://127\.0\.0\.1:9/x failed: ") as err:
        AdminHttp(None, "tok-1", 2).send("http://127.0.0.1:9/x")
    assert "tok-1" not in str(err.value)
