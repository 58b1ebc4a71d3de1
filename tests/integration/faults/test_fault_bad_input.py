"""Fault suite, bad input: every kind of invalid option, file or permission is refused by the command line
with exit code 2 and a message naming the problem and the fix, before anything is written (no run
directory, no state), and no value that could be a token is printed."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fault_support import CASES, FaultRow

from spark_apps.dlq_replay.cli import EXIT_USAGE, main

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
TOKEN = "eyJhbGciOiJIUzI1NiJ9.ZmF1bHQtc3VpdGU.faultSuiteSignature"


@dataclass(frozen=True)
class Refusal:
    fault: str
    argv: list[str]  # extra arguments (replacing defaults with the same option)
    message: str  # a fragment of the error the user sees


def write(path: Path, data: str | bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data)
    return str(path)


def refusals(tmp: Path) -> dict[str, Refusal]:
    pb = tmp / "playbooks"
    rules = "rules:\n" + "".join(f"  - {{name: r{i}, action: skip}}\n" for i in range(1001))
    r = {
        "allowlist-invalid-regex": Refusal(
            "`--origin-allowlist 're:orders(['`",
            ["--origin-allowlist", "re:orders(["],
            "invalid regular expression",
        ),
        "allowlist-not-a-topic": Refusal(
            "`--origin-allowlist a/b`", ["--origin-allowlist", "a/b"], "must look like a topic name"
        ),
        "token-file-missing": Refusal(
            "`--auth-token-file` naming no file (here: a token)",
            ["--auth-token-file", TOKEN],
            "cannot be read",
        ),
        "token-on-command-line": Refusal(
            "`--auth-tok <token>` (an abbreviation of a token option)",
            ["--auth-tok", TOKEN],
            "PULSAR_AUTH_TOKEN",
        ),
        "trust-file-not-pem": Refusal(
            "`--tls-trust-certs-file` holding no certificate",
            ["--tls-trust-certs-file", write(tmp / "ca.txt", "not a certificate")],
            "holds no PEM certificate",
        ),
        "playbook-malformed-yaml": Refusal(
            "a playbook that is not YAML",
            ["--playbook", write(pb / "bad.yaml", "rules:\n  - name: [unclosed\n")],
            "invalid YAML",
        ),
        "playbook-huge": Refusal(
            "a 2 MiB playbook",
            ["--playbook", write(pb / "huge.yaml", "rules: []\n" + "#" * (2 * 1024 * 1024))],
            "larger than 1024 KiB",
        ),
        "playbook-too-many-rules": Refusal(
            "a playbook of 1,001 rules", ["--playbook", write(pb / "many.yaml", rules)], "at most 1000"
        ),
        "playbook-is-a-directory": Refusal(
            "`--playbook` naming a directory", ["--playbook", str(HERE)], "is a directory"
        ),
        "playbook-not-utf8": Refusal(
            "a playbook in Latin-1",
            ["--playbook", write(pb / "latin.yaml", b"rules: []\n# caf\xe9\n")],
            "not UTF-8 text",
        ),
        "playbook-unknown-action": Refusal(
            "a rule with action `republsh`",
            ["--playbook", write(pb / "typo.yaml", "rules:\n  - {name: a, action: republsh}\n")],
            "unknown action 'republsh'",
        ),
        "fix-module-missing": Refusal(
            "a fix whose module does not exist",
            [
                "--playbook",
                write(
                    pb / "nofix.yaml",
                    "rules:\n  - {name: a, action: republish, fix: no_such_module:fix, fix_version: '1'}\n",
                ),
            ],
            "cannot import module 'no_such_module'",
        ),
        "output-dir-under-a-file": Refusal(
            "`--output-dir` below a regular file",
            ["--output-dir", str(Path(write(tmp / "a-file", "x")) / "out")],
            "is not a directory",
        ),
        "output-dir-not-creatable": Refusal(
            "`--output-dir` where no directory can be created (`/proc`)",
            ["--output-dir", "/proc/dlq-replay-out"],
            "cannot create it in /proc",
        ),
        "since-after-until": Refusal(
            "`--since` after `--until`",
            ["--since", "2024-05-02", "--until", "2024-05-01"],
            "must be before --until",
        ),
        "signature-not-hex": Refusal(
            "`--signatures abc`", ["--signatures", "abc"], "16 lower-case hex digits"
        ),
        "resume-with-changed-options": Refusal(
            "the same `--run-id` again with `--max-replays 5`", ["--max-replays", "5"], "changed: max_replays"
        ),
    }
    assert tuple(r) == CASES["bad-input"]
    return r


def merged(base: list[str], extra: list[str]) -> list[str]:
    """``base`` with the options in ``extra`` replaced or added."""
    out, i = [], 0
    given = {extra[j] for j in range(0, len(extra), 2)}
    while i < len(base):
        if base[i] in given:
            i += 2
            continue
        out.append(base[i])
        i += 1
    return out + extra


def test_every_kind_of_bad_input_is_refused_before_anything_is_written(
    spark, pulsar_service_url, pulsar_client, topic_factory, fault_table, tmp_path, capsys
):
    from spark_apps.dlq_replay.options import ReplayOptions
    from spark_apps.dlq_replay.runner import run_replay

    dlq = topic_factory("bad-input-DLQ")
    pulsar_client.create_producer(dlq).close()
    out = tmp_path / "out"
    run_id = "bad-input"
    base = [
        "--run-id", run_id, "--service-url", pulsar_service_url, "--topics", dlq, "--output-dir", str(out),
        "--idle-timeout-ms", "500",
    ]  # fmt: skip
    # A finished dry-run of that run id: resuming it with other options must be refused.
    first = ReplayOptions(
        run_id=run_id, output_dir=str(out), service_url=pulsar_service_url, topics=(dlq,), idle_timeout_ms=500
    )
    run_replay(spark, first)
    state = (out / "runs" / run_id / "state.json").read_text()
    before = sorted(p.relative_to(out) for p in out.rglob("*"))

    for name, refusal in refusals(tmp_path / "files").items():
        argv = merged(base, refusal.argv)
        if name != "resume-with-changed-options":
            argv = merged(argv, ["--run-id", f"refused-{name}"])
        code = main(argv)
        captured = capsys.readouterr()
        assert code == EXIT_USAGE, (name, captured.err[-2000:])
        assert refusal.message in captured.err, (name, captured.err[-2000:])
        assert TOKEN not in captured.out + captured.err, name
        assert "Traceback" not in captured.err, name
        assert sorted(p.relative_to(out) for p in out.rglob("*")) == before, f"{name} wrote something"
        error = next(line for line in captured.err.splitlines() if "error" in line)
        fault_table.record(
            FaultRow(
                category="bad-input",
                case=name,
                fault=refusal.fault,
                expected="exit 2 naming the problem and the fix; nothing written",
                result=f"exit {code}: {error.split('error: ', 1)[-1][:150]}",
            )
        )
    assert (out / "runs" / run_id / "state.json").read_text() == state
    assert not Path("/proc/dlq-replay-out").exists()


# ------------------------------------------------------------------- secrets, missing topics, a held DLQ


def _no_token_anywhere(out: Path, captured: Any, caplog: Any) -> None:
    assert TOKEN not in captured.out + captured.err + caplog.text
    assert "faultSuiteSignature" not in captured.out + captured.err + caplog.text
    for path in out.rglob("*"):
        assert TOKEN not in str(path)
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path


def with_options(base: list[str], extra: list[str]) -> list[str]:
    """``base`` without the options ``extra`` gives (``--x v`` or ``--x=v``), then ``extra``."""
    names = {a.split("=", 1)[0] for a in extra if a.startswith("--")}
    out, i = [], 0
    while i < len(base):
        if base[i] in names:
            i += 2
            continue
        out.append(base[i])
        i += 1
    return out + extra


def secret_spellings(service: str, admin: str) -> dict[str, tuple[list[str], str]]:
    """Every way a token can be typed where it does not belong: extra arguments and the message the
    refusal must carry (all refused with exit 2 before anything is written)."""
    host = service.split("://", 1)[1]
    admin_host = admin.split("://", 1)[1]
    return {
        "--oauth2-issuer-url <token>": (
            ["--oauth2-issuer-url", TOKEN],
            "--oauth2-issuer-url must start with",
        ),
        "--oauth2-issuer-url https://id:<token>@...": (
            ["--oauth2-issuer-url", f"https://id:{TOKEN}@auth.example.com"],
            "must not carry credentials",
        ),
        "--playbook <token>": (["--playbook", TOKEN], "the file given as --playbook (path not shown"),
        "--group-actions @<token>": (["--group-actions", f"@{TOKEN}"], "cannot be read"),
        "--group-actions <token>": (["--group-actions", TOKEN], "is not valid JSON"),
        "--window-from <token>": (["--window-from", TOKEN], "--window-from looks like a token"),
        "--signatures <token>": (["--signatures", TOKEN], "a signature is 16 lower-case hex digits"),
        "--canary <token>": (["--canary", TOKEN], "--canary must be a count"),
        "--subscription <token>": (["--subscription", TOKEN], "--subscription looks like a token"),
        "--topics <token>": (["--topics", TOKEN], "--topics looks like a token"),
        "--run-id <token>": (["--run-id", TOKEN], "--run-id looks like a token"),
        "--service-url pulsar://user:<token>@host": (
            ["--service-url", f"pulsar://user:{TOKEN}@{host}"],
            "--service-url must not carry credentials",
        ),
        "--service-url=pulsar://<token>@host": (
            [f"--service-url=pulsar://{TOKEN}@{host}"],
            "--service-url must not carry credentials",
        ),
        "--service-url pulsar://host?token=<token>": (
            ["--service-url", f"pulsar://{host}?token={TOKEN}"],
            "--service-url must not carry a query",
        ),
        "--admin-url http://user:<token>@host": (
            ["--admin-url", f"http://user:{TOKEN}@{admin_host}"],
            "--admin-url must not carry credentials",
        ),
        "--admin-url http://host?token=<token>": (
            ["--admin-url", f"{admin}?token={TOKEN}"],
            "--admin-url must not carry a query",
        ),
        "--admin-url http://host/#<token>": (["--admin-url", f"{admin}/#{TOKEN}"], "must not carry a query"),
        "--admin-url http://host/<token>": (["--admin-url", f"{admin}/{TOKEN}"], "looks like a token"),
    }


def test_a_token_in_any_option_or_url_part_is_refused_and_never_printed_or_written(
    spark, pulsar_broker, pulsar_client, topic_factory, tmp_path, capsys, caplog
):
    dlq = topic_factory("secrets-DLQ")
    pulsar_client.create_producer(dlq).close()
    out = tmp_path / "out"
    base = [
        "--run-id", "secrets", "--service-url", pulsar_broker.service_url, "--topics", dlq,
        "--output-dir", str(out), "--idle-timeout-ms", "500",
    ]  # fmt: skip
    for name, (extra, message) in secret_spellings(
        pulsar_broker.service_url, pulsar_broker.admin_url
    ).items():
        code = main(with_options(base, extra))
        captured = capsys.readouterr()
        assert code == EXIT_USAGE, (name, captured.err[-2000:])
        assert message in captured.err, (name, captured.err[-2000:])
        assert "Traceback" not in captured.err, name
        _no_token_anywhere(out, captured, caplog)
        assert not out.exists(), f"{name} wrote something"
        caplog.clear()


def test_a_token_from_the_environment_is_used_and_never_printed_or_written(
    spark, pulsar_broker, pulsar_client, topic_factory, tmp_path, capsys, caplog, monkeypatch
):
    """The supported way (PULSAR_AUTH_TOKEN): the run succeeds (the session broker ignores tokens) and
    the token is in no output, log or file, plan.json and state.json included."""
    from pyspark.sql import SparkSession

    dlq = topic_factory("env-token-DLQ")
    pulsar_client.create_producer(dlq).close()
    monkeypatch.setenv("PULSAR_AUTH_TOKEN", TOKEN)
    monkeypatch.setattr(SparkSession, "stop", lambda self: None)  # the session is shared by the tests
    out = tmp_path / "out"
    argv = [
        "--run-id", "env-token", "--service-url", pulsar_broker.service_url, "--topics", dlq,
        "--output-dir", str(out), "--idle-timeout-ms", "500", "--admin-url", pulsar_broker.admin_url,
    ]  # fmt: skip
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert (out / "runs" / "env-token" / "plan.json").is_file()
    _no_token_anywhere(out, captured, caplog)


def _broker_topics(broker: Any, namespace: str = "public/default") -> list[str]:
    admin = broker.admin()
    return [
        *admin.get(f"/admin/v2/namespaces/{namespace}/topics"),
        *admin.get(f"/admin/v2/persistent/{namespace}/partitioned"),
    ]


def test_a_dlq_topic_that_does_not_exist_is_refused_and_not_created(
    spark, pulsar_broker, pulsar_client, topic_factory, tmp_path, capsys
):
    real = topic_factory("real-DLQ")
    pulsar_client.create_producer(real).close()
    missing = real + "-misspelt"
    out = tmp_path / "out"
    argv = [
        "--run-id", "missing-topic", "--service-url", pulsar_broker.service_url,
        "--topics", f"{real},{missing}", "--output-dir", str(out), "--admin-url", pulsar_broker.admin_url,
    ]  # fmt: skip
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"DLQ topic {missing} does not exist" in err
    assert real + " " not in err.split("does not exist")[0].split("DLQ topic", 1)[1]
    assert not out.exists()
    assert not [t for t in _broker_topics(pulsar_broker) if t.startswith(missing)]


def test_an_admin_url_that_does_not_answer_is_refused_before_anything_is_written(
    spark, pulsar_broker, pulsar_client, topic_factory, tmp_path, capsys, monkeypatch
):
    import socket

    from spark_apps.dlq_replay import broker_checks

    monkeypatch.setattr(broker_checks, "ADMIN_TIMEOUT_S", 1.0)
    dlq = topic_factory("silent-admin-DLQ")
    pulsar_client.create_producer(dlq).close()
    out = tmp_path / "out"
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        argv = [
            "--run-id", "silent-admin", "--service-url", pulsar_broker.service_url, "--topics", dlq,
            "--output-dir", str(out), "--admin-url", f"http://127.0.0.1:{silent.getsockname()[1]}",
        ]  # fmt: skip
        assert main(argv) == EXIT_USAGE
    assert "cannot reach the Pulsar admin REST" in capsys.readouterr().err
    assert not out.exists()


def test_a_closed_service_port_fails_at_once_naming_it(spark, tmp_path, capsys):
    from pulsar_standalone import free_port
    from spark_apps.dlq_replay.cli import EXIT_FAILED

    port = free_port()
    out = tmp_path / "out"
    argv = [
        "--run-id", "closed-port", "--service-url", f"pulsar://127.0.0.1:{port}", "--topics", "orders-DLQ",
        "--output-dir", str(out),
    ]  # fmt: skip
    started = time.monotonic()
    assert main(argv) == EXIT_FAILED
    assert time.monotonic() - started < 15
    err = capsys.readouterr().err
    assert f"nothing is listening at 127.0.0.1:{port}" in err
    assert "lease" not in err
    assert not out.exists()


def test_a_second_run_on_the_same_dlq_through_another_subscription_is_refused_naming_the_first(
    spark, pulsar_broker, pulsar_client, topic_factory, tmp_path, capsys
):
    from spark_apps.dlq_replay.cli import EXIT_FAILED
    from spark_apps.dlq_replay.lock import SubscriptionLease
    from spark_apps.dlq_replay.pulsar_io.conf import PulsarConf

    dlq = topic_factory("one-run-DLQ")
    pulsar_client.create_producer(dlq).close()
    # The first run's lease, as the app takes it (a run reading through subscription "replayer-a").
    holder = SubscriptionLease(PulsarConf(pulsar_broker.service_url), (dlq,), "replayer-a", "first-run")
    holder.acquire()
    try:
        out = tmp_path / "out"
        argv = [
            "--run-id", "second-run", "--service-url", pulsar_broker.service_url, "--topics", dlq,
            "--output-dir", str(out), "--subscription", "replayer-b", "--admin-url", pulsar_broker.admin_url,
        ]  # fmt: skip
        assert main(argv) == EXIT_FAILED
        err = capsys.readouterr().err
        assert (
            f"another replay run is reading DLQ topic {dlq}: run 'first-run' (subscription 'replayer-a'"
            in err
        )
        assert not (out / "runs" / "second-run").exists()
    finally:
        holder.release()
    admin = pulsar_broker.admin()
    assert "replayer-b" not in admin.get(topic_stats_path(dlq))["subscriptions"]


def topic_stats_path(topic: str) -> str:
    return "/admin/v2/persistent/" + topic.split("://", 1)[1] + "/stats"


def test_a_refusal_after_the_lock_was_taken_leaves_nothing(
    spark, pulsar_broker, pulsar_client, topic_factory, tmp_path, monkeypatch
):
    """A first attempt refused once it holds the output lock (here: a lease the role may not consume)
    removes what it created: no run directory, no ``locks/``, no output root."""
    from spark_apps.dlq_replay import lock
    from spark_apps.dlq_replay.errors import ReplayConfigError
    from spark_apps.dlq_replay.options import ReplayOptions
    from spark_apps.dlq_replay.runner import run_replay

    def refused(self: Any) -> None:
        raise ReplayConfigError("cannot take the subscription lease (AuthorizationError)")

    monkeypatch.setattr(lock.SubscriptionLease, "acquire", refused)
    dlq = topic_factory("lease-refused-DLQ")
    pulsar_client.create_producer(dlq).close()
    out = tmp_path / "out"
    options = ReplayOptions(
        run_id="lease-refused", output_dir=str(out), service_url=pulsar_broker.service_url, topics=(dlq,)
    )
    with pytest.raises(ReplayConfigError, match="AuthorizationError"):
        run_replay(spark, options)
    assert not out.exists()
