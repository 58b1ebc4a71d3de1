"""Command line: every option documented, validation errors name the fix, exit codes, no secret echoed."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from spark_apps.dlq_replay import outcomes as oc
from spark_apps.dlq_replay.cli import EXIT_USAGE, build_parser, main, parse_options, secret_option_given
from spark_apps.dlq_replay.errors import ReplayConfigError

REPO = Path(__file__).resolve().parents[3]
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
    "--archive-payload", "--idle-timeout-ms", "--wave-size", "--subscription-lease", "--admin-url",
]  # fmt: skip
SIG = "3f1c9a0b2d4e6f81"


def test_help_documents_every_option_and_the_contract(capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["--help"])
    assert info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for option in CONTRACT_OPTIONS:
        assert option in text
    for phrase in ("Exit codes: 0", "2 invalid input", "DLQ_REPLAY_SUMMARY", "stderr"):
        assert phrase in text
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
    assert opts.wave_size is None  # 2000, or 250000 under broker deduplication (decided at apply)
    assert opts.subscription_lease is True


def test_all_options_parse():
    opts = parse_options(
        [*BASE, "--mode", "replay", "--origin-allowlist", "orders*,re:.*x",
         "--signatures", f"{SIG},{SIG[::-1]}", "--error-class", "ValueError", "--since", "2024-05-01",
         "--until", "2024-05-02T00:00:00Z",
         "--max-messages", "10", "--max-replays", "5", "--rate-limit", "100", "--parallelism", "2",
         "--archive-payload", "off", "--auth-token-file", "/t", "--tls-trust-certs-file", "/ca",
         "--subscription-lease", "off", "--wave-size", "10", "--admin-url", "https://broker:8443/"]
    )  # fmt: skip
    assert opts.origin_allowlist == ("orders*", "re:.*x")
    assert opts.signatures == (SIG, SIG[::-1])
    assert opts.since.isoformat() == "2024-05-01T00:00:00+00:00"
    assert opts.until.isoformat() == "2024-05-02T00:00:00+00:00"
    assert (opts.max_messages, opts.max_replays, opts.rate_limit, opts.parallelism) == (10, 5, 100.0, 2)
    assert opts.archive_payload is False
    assert opts.auth_token_file == "/t"
    assert opts.subscription_lease is False
    assert opts.wave_size == 10
    assert opts.admin_url == "https://broker:8443"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--mode", "replay"], "--origin-allowlist is required in replay mode"),
        (["--since", "yesterday"], "--since is not an ISO 8601"),
        (["--since", "2024-05-02", "--until", "2024-05-01"], "must be before --until"),
        (["--max-messages", "0"], "--max-messages must be >= 1"),
        (["--rate-limit", "-1"], "--rate-limit must be > 0"),
        (["--run-id", "a/b"], "--run-id: invalid run id"),
        (["--origin-allowlist", "re:orders(["], "invalid regular expression"),
        (["--origin-allowlist", "a/b"], "must look like a topic name"),
        (["--signatures", "abc123"], "16 lower-case hex digits"),
        (["--topics", "a/b"], "--topics: .* is not a valid topic name"),
        (["--service-url", "http://localhost:8080"], "binary-protocol URL"),
        (["--subscription", "bad\nname"], "without control characters"),
        (["--wave-size", "0"], "--wave-size must be >= 1"),
        (["--admin-url", "broker:8080"], "--admin-url must start with http:// or https://"),
    ],
)
def test_invalid_options_name_the_fix(extra, message):
    with pytest.raises(ReplayConfigError, match=message):
        parse_options([*BASE, *extra])


def test_abbreviations_are_refused(capsys):
    # With abbreviations on, argparse took --run for --run-id and --out for --output-dir.
    with pytest.raises(SystemExit) as info:
        parse_options(["--run", "r1", "--service-url", "pulsar://x:1", "--topics", "t", "--out", "/x"])
    assert info.value.code == EXIT_USAGE
    assert "the following arguments are required: --run-id, --output-dir" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_options([*BASE, "--max-msg", "5"])
    assert "unrecognized arguments" in capsys.readouterr().err


TOKEN = "eyJhbGciOiJIUzI1NiJ9.c2VjcmV0LXBheWxvYWQ.s3cr3tSignature"


@pytest.mark.parametrize(
    "argv",
    [
        [*BASE, "--auth-token", TOKEN],
        [*BASE, f"--auth-token={TOKEN}"],
        [*BASE, "--token", TOKEN],
        [*BASE, "--auth-tok", TOKEN],  # once taken as --auth-token-file, whose error echoed the "path"
        [*BASE, f"--auth-tok={TOKEN}"],
        [*BASE, "--auth_token", TOKEN],
        [*BASE, "--AUTH-TOKEN", TOKEN],
        [*BASE, "--pulsar-token", TOKEN],
        [*BASE, "--auth-params", TOKEN],
        [*BASE, "--password", TOKEN],
        [*BASE, f"--auth-token{TOKEN}"],
        [*BASE, "--auth-token-file", TOKEN],  # no such file
        [*BASE, f"--auth-token-file={TOKEN}"],
        [*BASE, "--tls-trust-certs-file", TOKEN],
        [*BASE, TOKEN],  # positional
        [TOKEN, *BASE],
        [*BASE[:2], TOKEN, *BASE[2:]],
        [*BASE, "-t", TOKEN],
        [*BASE, "--mode", TOKEN],
        [*BASE, "--max-messages", TOKEN],
        [*BASE, "--archive-payload", TOKEN],
        [*BASE, "--since", TOKEN],
        [*BASE, "--until", TOKEN],
        # A token typed as the value of another option, or inside a URL (refused before Spark starts).
        [*BASE, "--oauth2-issuer-url", TOKEN],
        [*BASE, "--oauth2-issuer-url", f"https://client:{TOKEN}@auth.example.com"],
        [*BASE, "--oauth2-issuer-url", f"https://auth.example.com/?secret={TOKEN}"],
        [*BASE, "--playbook", TOKEN],
        [*BASE, "--group-actions", f"@{TOKEN}"],
        [*BASE, "--group-actions", TOKEN],
        [*BASE, "--window-from", TOKEN],
        [*BASE, "--signatures", TOKEN],
        [*BASE, "--signatures", f"{SIG},{TOKEN}"],
        [*BASE, "--canary", TOKEN],
        [*BASE, "--subscription", TOKEN],
        [*BASE, "--topics", TOKEN],
        [*BASE, "--run-id", TOKEN],
        [*BASE, "--service-url", f"pulsar://user:{TOKEN}@localhost:6650"],
        [*BASE, "--service-url", f"pulsar://{TOKEN}@localhost:6650"],
        [*BASE, f"--service-url=pulsar://user:{TOKEN}@localhost:6650"],
        [*BASE, "--service-url", f"pulsar://localhost:6650?token={TOKEN}"],
        [*BASE, "--service-url", f"pulsar://localhost:6650/{TOKEN}"],
        [*BASE, "--service-url", TOKEN],
        [*BASE, "--admin-url", f"http://user:{TOKEN}@localhost:8080"],
        [*BASE, "--admin-url", f"http://localhost:8080?token={TOKEN}"],
        [*BASE, "--admin-url", f"http://localhost:8080/#{TOKEN}"],
        [*BASE, "--admin-url", f"http://localhost:8080/admin/{TOKEN}"],
        [*BASE, "--admin-url", TOKEN],
    ],
)
def test_a_token_typed_anywhere_is_refused_and_never_printed(argv, capsys, caplog):
    assert main(argv) == EXIT_USAGE
    out = capsys.readouterr()
    assert out.err.strip(), "the refusal must say what is wrong"
    for text in (out.out, out.err, caplog.text):
        assert TOKEN not in text
        assert "s3cr3t" not in text


def test_token_option_refusal_names_the_fix(capsys):
    assert main([*BASE, "--auth-token", TOKEN]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "PULSAR_AUTH_TOKEN" in err
    assert "--auth-token-file" in err


def test_secret_like_options_are_detected():
    assert secret_option_given(["--auth-tok=x"])
    assert secret_option_given(["--Pulsar_Token", "x"])
    assert not secret_option_given(["--auth-token-file", "/t", "--topics", "token-DLQ"])
    assert not secret_option_given(["--auth-token-file=/t"])


def test_unknown_arguments_are_not_echoed(capsys):
    with pytest.raises(SystemExit):
        parse_options([*BASE, "--bogus", "s3cr3t"])
    assert "s3cr3t" not in capsys.readouterr().err


def test_every_argument_parser_in_the_repository_refuses_abbreviations():
    """``allow_abbrev=False`` for every ``argparse.ArgumentParser`` (the replay app's ``_Parser`` sets it)."""
    offenders = []
    sources = [p for p in REPO.rglob("*.py") if not {".venv", "build", ".airflow"} & set(p.parts)]
    for path in sources:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name != "ArgumentParser":
                continue
            flag = [k for k in node.keywords if k.arg == "allow_abbrev"]
            if not flag or not (isinstance(flag[0].value, ast.Constant) and flag[0].value.value is False):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert offenders == []
    assert build_parser().allow_abbrev is False


def test_the_client_side_token_file_error_does_not_echo_the_path():
    """The same holds where executors read the token file (it may be missing on one of them)."""
    from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf
    from spark_apps.dlq_replay.pulsar_io.errors import PulsarConfigError

    with pytest.raises(PulsarConfigError) as info:
        PulsarConf("pulsar://localhost:6650", token_file=TOKEN).read_token()
    assert TOKEN not in str(info.value)
    assert "path not shown" in str(info.value)


class _Conf:
    """A session's runtime conf: ``given`` settings, ``refused`` keys that ``set`` rejects."""

    def __init__(self, given, refused=()):
        self.values = dict(given)
        self.refused = set(refused)

    def get(self, key, default=None):
        return self.values.get(key, default)

    def set(self, key, value):
        if key in self.refused:
            raise RuntimeError(f"[CANNOT_MODIFY_CONFIG] {key}")
        self.values[key] = value


@pytest.mark.parametrize(
    ("master", "partitions"), [("local[2]", "4"), ("local[64]", "128"), ("local[0]", "2")]
)
def test_session_defaults_size_shuffles_to_the_cores(master, partitions):
    """Two shuffle partitions per core (not Spark's 200, which made a small run thousands of tiny
    tasks), at least two."""
    from types import SimpleNamespace

    from spark_apps.dlq_replay.cli import apply_session_defaults

    conf = _Conf({"spark.master": master})
    apply_session_defaults(SimpleNamespace(conf=conf))
    assert conf.values["spark.sql.shuffle.partitions"] == partitions
    assert conf.values["spark.sql.execution.arrow.maxRecordsPerBatch"] == "2000"


def test_session_defaults_are_set_unless_given_or_refused(caplog):
    """Applied through the runtime conf only (a Spark Connect session has no SparkContext): given
    settings win, refused ones are left as they are, the cores come from the master."""
    import logging
    from types import SimpleNamespace

    from spark_apps.dlq_replay.cli import apply_session_defaults

    fresh = _Conf({"spark.master": "local[3]"})
    apply_session_defaults(SimpleNamespace(conf=fresh))
    assert fresh.values == {
        "spark.master": "local[3]",
        "spark.sql.shuffle.partitions": "6",
        "spark.sql.execution.arrow.maxRecordsPerBatch": "2000",
    }
    conf = _Conf(
        {"spark.master": "local[3]", "spark.sql.execution.arrow.maxRecordsPerBatch": "500"},  # --conf
        refused={"spark.sql.shuffle.partitions"},
    )
    with caplog.at_level(logging.INFO, logger="spark_apps.dlq_replay"):
        apply_session_defaults(SimpleNamespace(conf=conf))
    assert conf.values == {"spark.master": "local[3]", "spark.sql.execution.arrow.maxRecordsPerBatch": "500"}
    assert any("shuffle.partitions left as it is" in r.getMessage() for r in caplog.records)


def test_the_app_writes_progress_to_pythons_stderr(capsys):
    from spark_apps.dlq_replay.cli import configure_logging, log

    configure_logging()
    log.info("step plan: started")
    captured = capsys.readouterr()
    assert "step plan: started" in captured.err
    assert "step plan" not in captured.out


@pytest.mark.parametrize(
    ("option", "url", "message"),
    [
        ("--service-url", "pulsar://u:p4ssw0rd@localhost:6650", "must not carry credentials"),
        ("--service-url", "pulsar+ssl://localhost:6651?x=1", "must not carry a query"),
        ("--admin-url", "https://localhost:8443/?token=abc", "must not carry a query"),
        ("--admin-url", "http://user@localhost:8080", "must not carry credentials"),
        ("--oauth2-issuer-url", "https://auth.example.com#frag", "must not carry a query or fragment"),
    ],
)
def test_urls_with_credentials_or_a_query_are_refused_naming_where_the_token_goes(option, url, message):
    with pytest.raises(ReplayConfigError, match=message) as info:
        parse_options([*BASE, option, url])
    assert "PULSAR_AUTH_TOKEN" in str(info.value)
    assert url not in str(info.value)


def test_plain_urls_are_accepted():
    opts = parse_options(
        [
            *BASE,
            "--admin-url",
            "https://broker.example.com:8443/",
            "--oauth2-issuer-url",
            "https://auth.example.com/realms/x",
        ]
    )
    assert opts.admin_url == "https://broker.example.com:8443"
    assert parse_options([*BASE[:2], "--service-url", "pulsar://b1:6650,b2:6650", *BASE[4:]]).service_url
