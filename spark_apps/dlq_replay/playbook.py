"""The playbook (``docs/playbook.md``): ordered YAML rules from match conditions to an action (default:
skip), validated whole, every error naming the file and line. Matching is pure Python (on executors)."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import yaml

from pulsar_dlq_consumer.conventions import ORIGIN_TOPIC_KEYS, ContextFormat
from pulsar_dlq_consumer.topics import qualify_topic
from spark_apps.dlq_replay import outcomes
from spark_apps.dlq_replay.errors import PlaybookError, ReplayConfigError
from spark_apps.dlq_replay.topics import TopicMatcher

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping

PLAYBOOK_VERSION = 1
#: Limits on a playbook: a playbook is a short, reviewed list of rules, not data.
MAX_PLAYBOOK_BYTES = 1024 * 1024
MAX_RULES = 1000
#: Default and bounds of ``fix_timeout_seconds``: how long one call of a fix may take.
DEFAULT_FIX_TIMEOUT_S = 60.0
MAX_FIX_TIMEOUT_S = 3600.0
_FIX_REF = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")
_TOP_KEYS = ("version", "fix_files", "payload_off_topics", "origin_precedence", "rules")
#: The conventions a rule may match (not ``none``: a message without a parseable context is always
#: malformed, no rule applies).
_CONTEXT_FORMATS = tuple(f.value for f in ContextFormat if f is not ContextFormat.NONE)
_TOO_BIG = (
    f"the playbook is larger than {MAX_PLAYBOOK_BYTES // 1024} KiB; a playbook is a short list of rules "
    "(match many messages with one rule: a list of signatures, a regex), not data"
)


@dataclass(frozen=True)
class MatchInput:
    """What a rule can look at for one DLQ message (all values come from the message: untrusted)."""

    signature: str
    error_class: str | None
    error_message: str | None
    origin_topic: str | None
    context_format: str
    properties: Mapping[str, str]


@dataclass(frozen=True)
class PropertyCondition:
    key: str
    exact: str | None
    regex: re.Pattern[str] | None

    def matches(self, properties: Mapping[str, str]) -> bool:
        value = properties.get(self.key)
        if self.regex is None:
            return value == self.exact
        return value is not None and self.regex.fullmatch(value) is not None


@dataclass(frozen=True)
class Rule:
    """One playbook rule. All given conditions must hold; a list inside a condition means "any of"."""

    name: str
    action: str
    line: int
    signatures: frozenset[str] | None = None
    error_class: re.Pattern[str] | None = None
    error_message: re.Pattern[str] | None = None
    origin_topic: TopicMatcher | None = None
    context_formats: frozenset[str] | None = None
    properties: tuple[PropertyCondition, ...] = ()
    reason: str | None = None
    fix: str | None = None
    fix_version: str | None = None
    on_fix_error: str = outcomes.ON_FIX_ERROR_PENDING
    archive_payload: bool | None = None
    fix_timeout_seconds: float = DEFAULT_FIX_TIMEOUT_S

    def failed_conditions(self, record: MatchInput) -> Iterator[str | PropertyCondition]:
        """The conditions ``record`` fails, in check order: a ``match:`` key or a property condition."""
        if self.signatures is not None and record.signature not in self.signatures:
            yield "signature"
        if self.context_formats is not None and record.context_format not in self.context_formats:
            yield "context_format"
        if self.error_class is not None and not self.error_class.search(record.error_class or ""):
            yield "error_class"
        if self.error_message is not None and not self.error_message.search(record.error_message or ""):
            yield "error_message"
        topics = self.origin_topic
        if topics is not None and not topics.matches(qualify_topic(record.origin_topic)):
            yield "origin_topic"
        yield from (cond for cond in self.properties if not cond.matches(record.properties))

    def matches(self, record: MatchInput) -> bool:
        return next(self.failed_conditions(record), None) is None

    @property
    def fix_label(self) -> str:
        """``module:function@version`` (the ``REPLAY_FIX`` property), or ``""`` without a fix."""
        return f"{self.fix}@{self.fix_version}" if self.fix else ""


@dataclass(frozen=True)
class Playbook:
    """Ordered rules; the first rule that matches decides. No match means ``skip``."""

    rules: tuple[Rule, ...] = ()
    fix_files: tuple[str, ...] = ()
    path: str | None = None
    digest: str = field(default_factory=lambda: hashlib.sha256(b"").hexdigest())
    payload_off_topics: TopicMatcher | None = None
    #: Property keys naming the origin topic, first wins, used when a message's conventions disagree.
    origin_precedence: tuple[str, ...] = ()

    def payload_off(self, dlq_topic: str | None, origin_topic: str | None) -> bool:
        """True when the DLQ topic or the origin topic is listed under ``payload_off_topics``."""
        if self.payload_off_topics is None:
            return False
        return any(self.payload_off_topics.matches(qualify_topic(t)) for t in (dlq_topic, origin_topic))

    def first_match(self, record: MatchInput) -> Rule | None:
        return next((rule for rule in self.rules if rule.matches(record)), None)

    @property
    def fixes(self) -> tuple[str, ...]:
        """The distinct fix references used by republish rules, in rule order."""
        return tuple(dict.fromkeys(rule.fix for rule in self.rules if rule.fix))


def load_playbook(path: str) -> Playbook:
    """Read and validate a playbook file; errors name file:line (never a path that could be a token)."""
    from spark_apps.dlq_replay.redaction import could_be_secret

    where = path
    if could_be_secret(path):
        where = "the file given as --playbook (path not shown, as it could be a token)"
    if os.path.isdir(path):
        raise PlaybookError("is a directory; --playbook takes the path of the playbook YAML file", path=where)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_PLAYBOOK_BYTES + 1)
    except OSError as exc:
        raise PlaybookError(
            f"cannot read the playbook ({exc.strerror}); check the --playbook path and its permissions",
            path=where,
        ) from exc
    if len(raw) > MAX_PLAYBOOK_BYTES:
        raise PlaybookError(_TOO_BIG, path=where)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise PlaybookError(
            f"not UTF-8 text (byte {exc.start}); save the playbook as UTF-8", path=where, line=line
        ) from exc
    playbook = parse_playbook(text, path=where)
    base = os.path.dirname(os.path.abspath(path))  # an absolute entry is kept by join
    fix_files = tuple(os.path.normpath(os.path.join(base, p)) for p in playbook.fix_files)
    for fix_file in fix_files:
        if not os.path.isfile(fix_file):
            raise PlaybookError(
                f"fix_files entry {fix_file!r} does not exist; paths are relative to the playbook file",
                path=where,
            )
    return replace(playbook, fix_files=fix_files, path=path)


class _Invalid(ReplayConfigError):
    """A problem at ``line`` of the playbook text; :func:`parse_playbook` adds the file's name."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.line = line


def parse_playbook(text: str, *, path: str | None = None) -> Playbook:
    """Validate playbook YAML text. Raises :class:`PlaybookError` naming the line of the problem."""
    try:
        root = _compose(text)
        top = _mapping(root, "the playbook", _TOP_KEYS)
        version = _scalar(top["version"]) if "version" in top else PLAYBOOK_VERSION
        if str(version) != str(PLAYBOOK_VERSION):
            raise _Invalid(
                f"unsupported version {version!r}; this app reads version {PLAYBOOK_VERSION}",
                _line(top["version"]),
            )
        if "rules" not in top:
            raise _Invalid("missing `rules:` (a list of rules; an empty list skips everything)", _line(root))
        precedence: tuple[str, ...] = ()
        if "origin_precedence" in top:
            precedence = tuple(_strings(top["origin_precedence"], "origin_precedence", _ORIGIN_PRECEDENCE))
        if len(set(precedence)) != len(precedence):
            raise _Invalid("origin_precedence lists a property twice", _line(top["origin_precedence"]))
        off = top.get("payload_off_topics")
        return Playbook(
            _parse_rules(top["rules"]),
            tuple(_strings(top["fix_files"], "fix_files entry", empty_ok=True)) if "fix_files" in top else (),
            digest=hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest(),
            payload_off_topics=None if off is None else _topics(off, "payload_off_topics"),
            origin_precedence=precedence,
            path=path,
        )
    except _Invalid as invalid:
        raise PlaybookError(invalid.args[0], path=path, line=invalid.line) from invalid.__cause__


def _compose(text: str) -> yaml.Node:
    """The YAML node tree of a playbook; invalid or empty YAML raises :class:`_Invalid`."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except RecursionError as exc:
        raise _Invalid("the YAML is nested too deeply to be a playbook") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise _Invalid(f"invalid YAML: {problem}", line) from exc
    if root is None:
        raise _Invalid("the playbook is empty; it needs at least `rules:`", 1)
    return root


def _parse_rules(node: yaml.Node) -> tuple[Rule, ...]:
    """The rules, in order: at most :data:`MAX_RULES`, each name once."""
    if not isinstance(node, yaml.SequenceNode):
        raise _Invalid("`rules` must be a list", _line(node))
    if len(node.value) > MAX_RULES:
        raise _Invalid(
            f"{len(node.value)} rules; a playbook holds at most {MAX_RULES} (one rule can match many "
            "signatures, classes or topics: give them as a list)",
            _line(node),
        )
    rules = [_parse_rule(rule_node, index) for index, rule_node in enumerate(node.value, start=1)]
    names: dict[str, int] = {}
    for rule in rules:
        if rule.name in names:
            raise _Invalid(
                f"duplicate rule name {rule.name!r} (first at line {names[rule.name]}); names must be unique",
                rule.line,
            )
        names[rule.name] = rule.line
    return tuple(rules)


def _line(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


def _mapping(node: yaml.Node, what: str, allowed: Iterable[str]) -> dict[str, yaml.Node]:
    if not isinstance(node, yaml.MappingNode):
        raise _Invalid(f"{what} must be a mapping (key: value)", _line(node))
    out: dict[str, yaml.Node] = {}
    for key_node, value_node in node.value:
        key = _scalar(key_node)
        if not isinstance(key, str):
            raise _Invalid(f"{what}: keys must be strings, got {key!r}", _line(key_node))
        if key not in allowed:
            raise _Invalid(f"unknown key {key!r} in {what}; allowed: {', '.join(allowed)}", _line(key_node))
        if key in out:
            raise _Invalid(f"duplicate key {key!r} in {what}", _line(key_node))
        out[key] = value_node
    return out


def _scalar(node: yaml.Node) -> Any:
    if not isinstance(node, yaml.ScalarNode):
        raise _Invalid("expected a single value here, not a list or mapping", _line(node))
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    finally:
        loader.dispose()


def _string(node: yaml.Node, what: str) -> str:
    value = _scalar(node)
    if isinstance(value, bool) or value is None:
        raise _Invalid(f"{what} must be a string, got {value!r}", _line(node))
    text = str(value)
    if not text.strip():
        raise _Invalid(f"{what} must not be empty", _line(node))
    return text


def _choice(noun: str, choices: tuple[str, ...]) -> Callable[[yaml.Node, str], str]:
    """A parser of one string among ``choices`` (``noun``: what the error calls a value)."""

    def parse(node: yaml.Node, what: str) -> str:
        value = _string(node, what)
        if value not in choices:
            raise _Invalid(f"{what}: unknown {noun} {value!r}; use one of {', '.join(choices)}", _line(node))
        return value

    return parse


def _strings(
    node: yaml.Node, what: str, parse: Callable[[yaml.Node, str], str] = _string, *, empty_ok: bool = False
) -> list[str]:
    """One string or a list of them, each read by ``parse``."""
    items = node.value if isinstance(node, yaml.SequenceNode) else [node]
    if not items and not empty_ok:
        raise _Invalid(f"{what} must not be an empty list", _line(node))
    return [parse(item, what) for item in items]


def _compile(pattern: str, what: str, node: yaml.Node) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise _Invalid(f"{what}: invalid regular expression: {exc}", _line(node)) from exc


def _regex(node: yaml.Node, what: str) -> re.Pattern[str]:
    return _compile("|".join(f"(?:{p})" for p in _strings(node, what)), what, node)


def _topics(node: yaml.Node, what: str) -> TopicMatcher:
    try:
        return TopicMatcher.parse(_strings(node, what), what=what)
    except ReplayConfigError as exc:
        raise _Invalid(str(exc), _line(node)) from exc


def _bool(node: yaml.Node, what: str) -> bool:
    value = _scalar(node)
    if not isinstance(value, bool):
        raise _Invalid(f"{what} must be true or false, got {value!r}", _line(node))
    return value


def _fix(node: yaml.Node, what: str) -> str:
    fix = _string(node, what)
    if not _FIX_REF.fullmatch(fix):
        example = "orders_fixes:add_currency"
        raise _Invalid(f"{what} {fix!r} must be `module:function` (e.g. {example})", _line(node))
    return fix


def _fix_timeout(node: yaml.Node, what: str) -> float:
    value = _scalar(node)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not 0 < value <= MAX_FIX_TIMEOUT_S:
        raise _Invalid(
            f"{what} must be a number of seconds in (0, {MAX_FIX_TIMEOUT_S:g}]; got {value!r}", _line(node)
        )
    return float(value)


def _properties(node: yaml.Node, what: str) -> tuple[PropertyCondition, ...]:
    """Each ``key: value`` (equal) or ``key: re:<regex>`` (full match)."""
    if not isinstance(node, yaml.MappingNode) or not node.value:
        raise _Invalid(f"{what} must be a non-empty mapping of property: value", _line(node))
    conditions = []
    for key_node, value_node in node.value:
        key = _string(key_node, f"{what} key")
        value = _string(value_node, f"{what}.{key}")
        regex = _compile(value[3:], f"{what}.{key}", value_node) if value.startswith("re:") else None
        conditions.append(PropertyCondition(key, value if regex is None else None, regex))
    return tuple(conditions)


_ORIGIN_PRECEDENCE = _choice("origin topic property", ORIGIN_TOPIC_KEYS)
_CONTEXT_FORMAT = _choice("context_format", _CONTEXT_FORMATS)

#: Per ``match:`` condition, in the order they are checked: the ``Rule`` field it sets and its parser.
MATCH_CONDITIONS: dict[str, tuple[str, Callable[[yaml.Node, str], Any]]] = {
    "signature": ("signatures", lambda node, what: frozenset(_strings(node, what))),
    "error_class": ("error_class", _regex),
    "error_message": ("error_message", _regex),
    "origin_topic": ("origin_topic", _topics),
    "context_format": ("context_formats", lambda node, w: frozenset(_strings(node, w, _CONTEXT_FORMAT))),
    "properties": ("properties", _properties),
}

#: Per ``Rule`` field a rule may set: its parser and the actions it applies to (``None``: every action).
_RULE_FIELDS: dict[str, tuple[Callable[[yaml.Node, str], Any], tuple[str, ...] | None]] = {
    "reason": (_string, None),
    "fix": (_fix, (outcomes.REPUBLISH,)),
    "fix_version": (_string, (outcomes.REPUBLISH,)),
    "on_fix_error": (_choice("value", outcomes.ON_FIX_ERROR_CHOICES), (outcomes.REPUBLISH,)),
    "fix_timeout_seconds": (_fix_timeout, (outcomes.REPUBLISH,)),
    "archive_payload": (_bool, (outcomes.ARCHIVE,)),
}
_RULE_KEYS = ("name", "match", "action", "description", *_RULE_FIELDS)  # description: free text, not read


def _parse_rule(node: yaml.Node, index: int) -> Rule:
    fields = _mapping(node, f"rule #{index}", _RULE_KEYS)
    line = _line(node)
    name = _string(fields["name"], f"rule #{index} name") if "name" in fields else f"rule-{index}"
    what = f"rule {name!r}"
    if "action" not in fields:
        raise _Invalid(f"{what} has no `action`; use one of {', '.join(outcomes.ACTIONS)}", line)
    action = _choice("action", outcomes.ACTIONS)(fields["action"], what)
    kwargs: dict[str, Any] = {"name": name, "action": action, "line": line}
    for key, (parse, actions) in _RULE_FIELDS.items():
        if key not in fields:
            continue
        if actions is not None and action not in actions:
            raise _Invalid(f"{what}: `{key}` does not apply to action {action!r}", _line(fields[key]))
        kwargs[key] = parse(fields[key], f"{what} {key}")
    if "fix_version" in kwargs and "fix" not in kwargs:
        raise _Invalid(f"{what}: `fix_version` without `fix`", _line(fields["fix_version"]))
    if "fix" in kwargs and "fix_version" not in kwargs:
        raise _Invalid(f"{what}: a fix needs `fix_version` (recorded in REPLAY_FIX and the ledger)", line)
    if "match" in fields:
        kwargs.update(_parse_match(fields["match"], what))
    return Rule(**kwargs)


def _parse_match(node: yaml.Node, what: str) -> dict[str, Any]:
    """The ``Rule`` fields of a rule's ``match:`` (empty: matches every message)."""
    if isinstance(node, yaml.ScalarNode) and _scalar(node) is None:
        return {}
    conditions = _mapping(node, f"{what} match", MATCH_CONDITIONS)
    return {
        name: parse(conditions[key], f"{what} match.{key}")
        for key, (name, parse) in MATCH_CONDITIONS.items()
        if key in conditions
    }
