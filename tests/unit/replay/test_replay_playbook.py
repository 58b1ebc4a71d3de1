"""Playbook: schema validation (errors name file:line) and rule matching."""

from __future__ import annotations

import textwrap

import pytest

from spark_apps.dlq_replay.errors import PlaybookError
from spark_apps.dlq_replay.playbook import MatchInput, Playbook, load_playbook, parse_playbook

GOOD = textwrap.dedent(
    """\
    version: 1
    payload_off_topics: [persistent://public/default/payments*]
    rules:
      - name: by-signature
        match: {signature: [abc123, def456]}
        action: archive
        archive_payload: false
        reason: known poison
      - name: currency
        match:
          error_class: "ValueError$"
          error_message: "currency"
          origin_topic: orders*
          properties: {env: prod, region: "re:eu-.*"}
        action: republish
        fix: orders_fixes:add_currency
        fix_version: 2
        on_fix_error: archive
      - name: test-traffic
        match: {properties: {env: test}}
        action: drop
      - name: rest
        action: skip
    """
)


def record(**kw):
    base = {
        "signature": "zzz",
        "error_class": "builtins.ValueError",
        "error_message": "unknown currency 'XYZ'",
        "origin_topic": "persistent://public/default/orders",
        "context_format": "ours",
        "properties": {"env": "prod", "region": "eu-west"},
    }
    base.update(kw)
    return MatchInput(**base)


def test_rules_match_in_order_first_wins():
    pb = parse_playbook(GOOD, path="pb.yaml")
    assert [r.name for r in pb.rules] == ["by-signature", "currency", "test-traffic", "rest"]
    assert pb.first_match(record(signature="abc123")).name == "by-signature"
    rule = pb.first_match(record())
    assert rule.name == "currency"
    assert rule.fix_label == "orders_fixes:add_currency@2"
    assert rule.on_fix_error == "archive"
    assert pb.first_match(record(properties={"env": "test"})).name == "test-traffic"
    assert pb.first_match(record(properties={"env": "prod", "region": "us-east"})).name == "rest"
    assert pb.first_match(record(origin_topic="orders-partition-1")).name == "currency"
    assert pb.first_match(record(origin_topic="persistent://public/default/payments")).name == "rest"
    assert pb.first_match(record(error_class=None)).name == "rest"
    assert pb.fixes == ("orders_fixes:add_currency",)
    assert pb.rules[0].archive_payload is False


def test_no_rule_matches_means_none_and_empty_playbook_skips_everything():
    pb = parse_playbook("rules:\n  - match: {signature: x}\n    action: drop\n")
    assert pb.first_match(record()) is None
    assert pb.rules[0].name == "rule-1"
    assert Playbook().first_match(record()) is None


def test_payload_off_topics():
    pb = parse_playbook(GOOD)
    assert pb.payload_off("persistent://p/d/dlq", "persistent://public/default/payments")
    assert pb.payload_off("payments-DLQ", None)
    assert not pb.payload_off("persistent://p/d/dlq", "orders")


def test_context_format_condition():
    pb = parse_playbook("rules:\n  - match: {context_format: [kip1191, spring]}\n    action: archive\n")
    assert pb.first_match(record(context_format="spring")) is not None
    assert pb.first_match(record(context_format="ours")) is None


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("rules:\n  - action: republsh\n", 2, "unknown action 'republsh'"),
        ("rules:\n  - name: x\n    action: skip\n    fix: a:b\n", 4, "`fix` does not apply to action 'skip'"),
        ("x: 1\nrules: []\n", 1, "unknown key 'x'"),
        (
            "rules:\n  - action: archive\n    match:\n      error_class: '('\n",
            4,
            "invalid regular expression",
        ),
        ("rules: [\n", 2, "invalid YAML"),
        (
            "rules:\n  - action: republish\n    fix: not-a-ref\n    fix_version: 1\n",
            3,
            "must be `module:function`",
        ),
        ("rules:\n  - action: republish\n    fix: m:f\n", 2, "needs `fix_version`"),
        ("rules:\n  - action: republish\n    fix_version: 1\n", 3, "`fix_version` without `fix`"),
        ("rules:\n  - action: republish\n    on_fix_error: drop\n", 3, "on_fix_error: unknown value 'drop'"),
        ("rules:\n  - action: archive\n    archive_payload: maybe\n", 3, "must be true or false"),
        ("rules:\n  - {name: a, action: skip}\n  - {name: a, action: drop}\n", 3, "duplicate rule name 'a'"),
        ("rules:\n  - action: skip\n    match: {origin: x}\n", 3, "unknown key 'origin'"),
        ("rules:\n  - action: skip\n    match: {context_format: xml}\n", 3, "unknown context_format 'xml'"),
        ("rules:\n  - match: {}\n", 2, "has no `action`"),
        ("version: 2\nrules: []\n", 1, "unsupported version 2"),
        ("rules: {a: 1}\n", 1, "`rules` must be a list"),
        ("", 1, "the playbook is empty"),
        ("version: 1\n", 1, "missing `rules:`"),
        ("rules:\n  - action: skip\n    match: {signature: []}\n", 3, "must not be an empty list"),
    ],
)
def test_invalid_playbooks_name_file_and_line(text, line, message):
    with pytest.raises(PlaybookError) as info:
        parse_playbook(text, path="my/playbook.yaml")
    assert str(info.value).startswith(f"my/playbook.yaml:{line}: ")
    assert message in str(info.value)
    assert info.value.line == line


def test_load_playbook_resolves_fix_files_relative_to_the_playbook(tmp_path):
    (tmp_path / "fixes").mkdir()
    (tmp_path / "fixes" / "f.py").write_text("def fix(r):\n    return r.payload\n")
    path = tmp_path / "pb.yaml"
    path.write_text("fix_files: [fixes/f.py]\nrules: []\n")
    pb = load_playbook(str(path))
    assert pb.fix_files == (str(tmp_path / "fixes" / "f.py"),)
    assert len(pb.digest) == 64
    path.write_text("fix_files: [missing.py]\nrules: []\n")
    with pytest.raises(PlaybookError, match="does not exist"):
        load_playbook(str(path))
    with pytest.raises(PlaybookError, match="cannot read the playbook"):
        load_playbook(str(tmp_path / "nope.yaml"))


def test_size_limits_bytes_and_rules(tmp_path):
    from spark_apps.dlq_replay.playbook import MAX_PLAYBOOK_BYTES, MAX_RULES

    big = tmp_path / "big.yaml"
    big.write_text("rules:\n" + "# padding\n" * (MAX_PLAYBOOK_BYTES // 10 + 1))
    with pytest.raises(PlaybookError, match=r"big\.yaml: the playbook is larger than 1024 KiB"):
        load_playbook(str(big))
    rules = "rules:\n" + "".join(f"  - {{name: r{i}, action: skip}}\n" for i in range(MAX_RULES + 1))
    with pytest.raises(PlaybookError, match=r"many\.yaml:2: 1001 rules; a playbook holds at most 1000"):
        parse_playbook(rules, path="many.yaml")
    assert len(parse_playbook(rules.rsplit("  - ", 1)[0]).rules) == MAX_RULES


def test_unreadable_playbooks_say_why(tmp_path):
    with pytest.raises(PlaybookError, match="is a directory; --playbook takes the path of the playbook YAML"):
        load_playbook(str(tmp_path))
    with pytest.raises(PlaybookError, match=r"cannot read the playbook \(No such file or directory\)"):
        load_playbook(str(tmp_path / "missing.yaml"))
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"rules: []\n# caf\xe9\n")
    with pytest.raises(PlaybookError, match=r"latin\.yaml:2: not UTF-8 text \(byte 15\)"):
        load_playbook(str(latin))
    with pytest.raises(PlaybookError, match="nested too deeply"):
        parse_playbook("rules: " + "[" * 200_000)


def test_origin_precedence_and_fix_timeout():
    pb = parse_playbook(
        "origin_precedence: [REAL_TOPIC, __dlq.errors.topic]\n"
        "rules:\n  - {name: r, action: republish, fix: m:f, fix_version: '1', fix_timeout_seconds: 2.5}\n"
    )
    assert pb.origin_precedence == ("REAL_TOPIC", "__dlq.errors.topic")
    assert pb.rules[0].fix_timeout_seconds == 2.5
    assert parse_playbook("rules: [{name: r, action: republish}]").rules[0].fix_timeout_seconds == 60.0
    with pytest.raises(PlaybookError, match=":1: origin_precedence: unknown origin topic property 'topic'"):
        parse_playbook("origin_precedence: [topic]\nrules: []")
    with pytest.raises(PlaybookError, match="fix_timeout_seconds must be a number of seconds"):
        parse_playbook("rules: [{name: r, action: republish, fix_timeout_seconds: 0}]")
    with pytest.raises(PlaybookError, match="`fix_timeout_seconds` does not apply to action 'skip'"):
        parse_playbook("rules: [{name: r, action: skip, fix_timeout_seconds: 1}]")
