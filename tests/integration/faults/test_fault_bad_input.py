"""Fault suite, bad input: every kind of invalid option, file or permission is refused by the command line
with exit code 2 and a message naming the problem and the fix, before anything is written (no run
directory, no state), and no value that could be a token is printed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
