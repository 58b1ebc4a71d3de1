"""One options type between the operator and the app: what the operator builds, the app parses back."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from datetime import UTC, datetime

import pytest

from pulsar_dlq_consumer.replay_options import (
    CanarySpec,
    ReplayOptions,
    ReplayOptionsError,
)
from spark_apps.dlq_replay.cli import parse_options
from spark_apps.dlq_replay.errors import ReplayConfigError

SIG = "3f1c9a0b2d4e6f81"
FULL = ReplayOptions(
    run_id="r1",
    output_dir="s3a://bucket/dlq",
    service_url="pulsar+ssl://broker:6651",
    topics=("persistent://acme/orders/a-DLQ", "b-DLQ"),
    mode="replay",
    subscription="replayer",
    auth_token_file="/t",
    tls_trust_certs_file="/ca",
    tls_cert_file="/c",
    tls_key_file="/k",
    oauth2_issuer_url="https://auth.example.com",
    oauth2_audience="aud",
    oauth2_scope="scope",
    oauth2_credentials_file="/o2",
    playbook="/p.yaml",
    origin_allowlist=("persistent://acme/orders/*", "re:.*x"),
    signatures=(SIG,),
    error_class="ValueError",
    since=datetime(2024, 5, 1, tzinfo=UTC),
    until=datetime(2024, 5, 2, 12, 30, tzinfo=UTC),
    max_messages=10,
    max_replays=5,
    rate_limit=12.5,
    parallelism=2,
    archive_payload=False,
    idle_timeout_ms=500,
    wave_size=100,
    subscription_lease=False,
    group_actions={SIG: "replay"},
    window_from="dry-1",
    canary=CanarySpec.parse(
        "10%", wait_seconds=30.0, max_failure_rate=0.2, watch_topics=("acme/orders/extra",)
    ),
    admin_url="https://broker:8443",
)


@pytest.mark.parametrize(
    "options",
    [FULL, ReplayOptions(run_id="r", output_dir="/o", service_url="pulsar://b:6650", topics=("t",))],
)
def test_the_app_parses_to_argv_back_into_the_same_options(options):
    parsed = parse_options(options.to_argv())
    assert dataclasses.asdict(parsed) == dataclasses.asdict(options)


def test_every_field_reaches_the_command_line():
    """A field added to the options without a flag in to_argv (or one the parser drops) fails here."""
    defaults = ReplayOptions(run_id="r", output_dir="/o", service_url="pulsar://b:6650", topics=("t",))
    changed = {
        f.name
        for f in dataclasses.fields(ReplayOptions)
        if getattr(FULL, f.name) != getattr(defaults, f.name)
    }
    assert changed == {f.name for f in dataclasses.fields(ReplayOptions)}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"mode": "wipe"}, "--mode must be one of dry-run, replay, archive-only"),
        ({"origin_allowlist": None}, "--origin-allowlist is required in replay mode"),
        ({"max_replays": 0}, "--max-replays must be >= 1"),
        ({"group_actions": {SIG: "delete"}}, "must each be one of replay, archive, leave"),
        ({"topics": ("a/b",)}, "is not a valid topic name"),
    ],
)
def test_a_rule_is_checked_once_for_both_sides(change, message):
    with pytest.raises(ReplayOptionsError, match=message):
        dataclasses.replace(FULL, **change)
    from spark_apps.dlq_replay.options import ReplayOptions as AppOptions

    with pytest.raises(ReplayConfigError, match=message):
        AppOptions(**{**{f.name: getattr(FULL, f.name) for f in dataclasses.fields(FULL)}, **change})


def test_the_operator_builds_the_options_without_spark():
    code = (
        "import sys; import airflow_provider_dlq.operators.replay; "
        "bad = [m for m in ('pyspark', 'pyarrow', 'spark_apps') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
