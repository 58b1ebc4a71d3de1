"""Command line: every option documented, validation errors name the fix, tokens refused."""

from __future__ import annotations

import pytest

from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay.cli import EXIT_USAGE, build_parser, main, parse_options
from spark_apps.dlq_replay.errors import ReplayConfigError

BASE = [
    "--run-id",
    "r1",
    "--service-url",
    "pulsar://localhost:6650",
    "--topics",
    "a-DLQ, b-DLQ",
    "--output-dir",
    "/x",
]
CONTRACT_OPTIONS = [
    "--run-id", "--mode", "--service-url", "--auth-token-file", "--tls-trust-certs-file", "--topics",
    "--subscription", "--playbook", "--output-dir", "--origin-allowlist", "--signatures", "--error-class",
    "--since", "--until", "--max-messages", "--max-replays", "--rate-limit", "--parallelism",
    "--archive-payload", "--admin-url",
]  # fmt: skip


def test_help_documents_every_option(capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    for option in CONTRACT_OPTIONS:
        assert option in text
    for action in build_parser()._actions:
        assert action.help, f"{action.option_strings} has no help"


def test_defaults():
    opts = parse_options(BASE)
    assert opts.mode == oc.DRY_RUN
    assert opts.subscription == "dlq-replayer"
    assert opts.max_replays == 3
    assert opts.topics == ("a-DLQ", "b-DLQ")
    assert opts.archive_payload is True
    assert opts.playbook is None


def test_all_options_parse():
    opts = parse_options(
        [*BASE, "--mode", "replay", "--origin-allowlist", "orders*,re:.*x", "--signatures", "s1,s2",
         "--error-class", "ValueError", "--since", "2024-05-01", "--until", "2024-05-02T00:00:00Z",
         "--max-messages", "10", "--max-replays", "5", "--rate-limit", "100", "--parallelism", "2",
         "--archive-payload", "off", "--auth-token-file", "/t", "--tls-trust-certs-file", "/ca",
         "--admin-url", "https://broker:8443/"]
    )  # fmt: skip
    assert opts.origin_allowlist == ("orders*", "re:.*x")
    assert opts.signatures == ("s1", "s2")
    assert opts.since.isoformat() == "2024-05-01T00:00:00+00:00"
    assert opts.until.isoformat() == "2024-05-02T00:00:00+00:00"
    assert (opts.max_messages, opts.max_replays, opts.rate_limit, opts.parallelism) == (10, 5, 100.0, 2)
    assert opts.archive_payload is False
    assert opts.auth_token_file == "/t"
    assert opts.admin_url == "https://broker:8443"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--mode", "replay"], "--origin-allowlist is required in replay mode"),
        (["--since", "yesterday"], "--since 'yesterday' is not ISO 8601"),
        (["--since", "2024-05-02", "--until", "2024-05-01"], "must be before --until"),
        (["--max-messages", "0"], "--max-messages must be >= 1"),
        (["--rate-limit", "-1"], "--rate-limit must be > 0"),
        (["--run-id", "a/b"], "--run-id: invalid run id"),
        (["--admin-url", "broker:8080"], "--admin-url must start with http:// or https://"),
    ],
)
def test_invalid_options_name_the_fix(extra, message):
    with pytest.raises(ReplayConfigError, match=message):
        parse_options([*BASE, *extra])


@pytest.mark.parametrize("arg", ["--auth-token", "--auth-token=s3cr3t", "--token"])
def test_tokens_on_the_command_line_are_refused_without_echo(arg, capsys):
    argv = [*BASE, arg, "s3cr3t"] if "=" not in arg else [*BASE, arg]
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "PULSAR_AUTH_TOKEN" in err
    assert "s3cr3t" not in err


def test_unknown_arguments_are_not_echoed(capsys):
    with pytest.raises(SystemExit):
        parse_options([*BASE, "--bogus", "s3cr3t"])
    assert "s3cr3t" not in capsys.readouterr().err
