"""The playbook: ordered YAML rules from match conditions to an action (default: skip).

Loading validates the whole file and every error names the file and the line of the bad value. The
schema is documented in ``docs/playbook.md``. Matching is pure Python and runs on executors.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import yaml

from pulsar_dlq_consumer.conventions import ContextFormat
from spark_apps.dlq_replay import outcomes
from spark_apps.dlq_replay.errors import PlaybookError, ReplayConfigError
from spark_apps.dlq_replay.topics import TopicMatcher, qualify_topic

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

PLAYBOOK_VERSION = 1
#: Limits on a playbook: a playbook is a short, reviewed list of rules, not data.
MAX_PLAYBOOK_BYTES = 1024 * 1024
MAX_RULES = 1000
#: Default and bounds of ``fix_timeout_seconds``: how long one call of a fix may take.
DEFAULT_FIX_TIMEOUT_S = 60.0
MAX_FIX_TIMEOUT_S = 3600.0
_FIX_REF = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")
_TOP_KEYS = ("version", "fix_files", "payload_off_topics", "origin_precedence", "rules")
_ACTION_KEYS: dict[str, tuple[str, ...]] = {
    outcomes.REPUBLISH: ("fix", "fix_version", "on_fix_error", "fix_timeout_seconds"),
    outcomes.ARCHIVE: ("archive_payload",),
    outcomes.DROP: (),
    outcomes.SKIP: (),
}
#: The keys only some actions take, and every key of a rule.
_ACTION_ONLY_KEYS = tuple(dict.fromkeys(key for keys in _ACTION_KEYS.values() for key in keys))
_RULE_KEYS = ("name", "description", "match", "action", "reason", *_ACTION_ONLY_KEYS)
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
        if value is None:
            return False
        if self.regex is not None:
            return self.regex.fullmatch(value) is not None
        return value == self.exact


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
        if self.origin_topic is not None and not self.origin_topic.matches(
            qualify_topic(record.origin_topic) if record.origin_topic else None
        ):
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
        candidates = (qualify_topic(t) if t else None for t in (dlq_topic, origin_topic))
        return any(self.payload_off_topics.matches(c) for c in candidates if c)

    def first_match(self, record: MatchInput) -> Rule | None:
        return next((rule for rule in self.rules if rule.matches(record)), None)

    @property
    def fixes(self) -> tuple[str, ...]:
        """The distinct fix references used by republish rules, in rule order."""
        return tuple(dict.fromkeys(rule.fix for rule in self.rules if rule.fix))


def load_playbook(path: str) -> Playbook:
    """Read and validate a playbook file (local path); errors name file:line (not a path that could be a
    token)."""
    from spark_apps.dlq_replay.redaction import could_be_secret

    where = (
        "the file given as --playbook (path not shown, as it could be a token)"
        if could_be_secret(path)
        else path
    )
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
    base = os.path.dirname(os.path.abspath(path))
    fix_files = tuple(
        p if os.path.isabs(p) else os.path.normpath(os.path.join(base, p)) for p in playbook.fix_files
    )
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
        return replace(_parse(text), path=path)
    except _Invalid as invalid:
        raise PlaybookError(invalid.args[0], path=path, line=invalid.line) from invalid.__cause__


def _parse(text: str) -> Playbook:
    encoded = text.encode("utf-8", "surrogatepass")
    if len(encoded) > MAX_PLAYBOOK_BYTES:
        raise _Invalid(_TOO_BIG)
    digest = hashlib.sha256(encoded).hexdigest()
    root = _compose(text)
    top = _mapping(root, "the playbook", _TOP_KEYS)
    version = _scalar(top["version"]) if "version" in top else PLAYBOOK_VERSION
    if str(version) != str(PLAYBOOK_VERSION):
        raise _Invalid(
            f"unsupported version {version!r}; this app reads version {PLAYBOOK_VERSION}",
            _line(top["version"]),
        )
    files = _sequence(top["fix_files"], "fix_files") if "fix_files" in top else []
    fix_files = tuple(_string(node, "fix_files entry") for node in files)
    off = top.get("payload_off_topics")
    payload_off = _topics(off, "payload_off_topics") if off is not None else None
    precedence = _origin_precedence(top["origin_precedence"]) if "origin_precedence" in top else ()
    if "rules" not in top:
        raise _Invalid("missing `rules:` (a list of rules; an empty list skips everything)", _line(root))
    rules = _parse_rules(top["rules"])
    return Playbook(
        rules, fix_files, digest=digest, payload_off_topics=payload_off, origin_precedence=precedence
    )


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


def _topics(node: yaml.Node, what: str) -> TopicMatcher:
    globs = _strings(node, what)
    try:
        return TopicMatcher.parse(globs, what=what)
    except ReplayConfigError as exc:
        raise _Invalid(str(exc), _line(node)) from exc


def _parse_rules(node: yaml.Node) -> tuple[Rule, ...]:
    """The rules, in order: at most :data:`MAX_RULES`, each name once."""
    rule_nodes = _sequence(node, "rules")
    if len(rule_nodes) > MAX_RULES:
        raise _Invalid(
            f"{len(rule_nodes)} rules; a playbook holds at most {MAX_RULES} (one rule can match many "
            "signatures, classes or topics: give them as a list)",
            _line(node),
        )
    rules: list[Rule] = []
    names: dict[str, int] = {}
    for index, rule_node in enumerate(rule_nodes, start=1):
        rule = _parse_rule(rule_node, index)
        if rule.name in names:
            raise _Invalid(
                f"duplicate rule name {rule.name!r} (first at line {names[rule.name]}); names must be unique",
                rule.line,
            )
        names[rule.name] = rule.line
        rules.append(rule)
    return tuple(rules)


def _origin_precedence(node: yaml.Node) -> tuple[str, ...]:
    from pulsar_dlq_consumer.context import ORIGIN_TOPIC_KEYS

    keys = _strings(node, "origin_precedence")
    for key in keys:
        if key not in ORIGIN_TOPIC_KEYS:
            raise _Invalid(
                f"origin_precedence: {key!r} is not a property that names an origin topic; use some of "
                f"{', '.join(ORIGIN_TOPIC_KEYS)}",
                _line(node),
            )
    if len(set(keys)) != len(keys):
        raise _Invalid("origin_precedence lists a property twice", _line(node))
    return tuple(keys)


# --------------------------------------------------------------------------- YAML node helpers


def _line(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


def _mapping(node: yaml.Node, what: str, allowed: tuple[str, ...]) -> dict[str, yaml.Node]:
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


def _sequence(node: yaml.Node, what: str) -> list[yaml.Node]:
    if not isinstance(node, yaml.SequenceNode):
        raise _Invalid(f"`{what}` must be a list", _line(node))
    return list(node.value)


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
    if isinstance(value, bool) or value is None or isinstance(value, (list, dict)):
        raise _Invalid(f"{what} must be a string, got {value!r}", _line(node))
    text = str(value)
    if not text.strip():
        raise _Invalid(f"{what} must not be empty", _line(node))
    return text


def _strings(node: yaml.Node, what: str) -> list[str]:
    if isinstance(node, yaml.SequenceNode):
        values = [_string(item, what) for item in node.value]
        if not values:
            raise _Invalid(f"{what} must not be an empty list", _line(node))
        return values
    return [_string(node, what)]


def _regex(node: yaml.Node, what: str) -> re.Pattern[str]:
    try:
        return re.compile("|".join(f"(?:{p})" for p in _strings(node, what)))
    except re.error as exc:
        raise _Invalid(f"{what}: invalid regular expression: {exc}", _line(node)) from exc


def _bool(node: yaml.Node, what: str) -> bool:
    value = _scalar(node)
    if not isinstance(value, bool):
        raise _Invalid(f"{what} must be true or false, got {value!r}", _line(node))
    return value


def _parse_rule(node: yaml.Node, index: int) -> Rule:
    what = f"rule #{index}"
    fields = _mapping(node, what, _RULE_KEYS)
    line = _line(node)
    name = _string(fields["name"], f"{what} name") if "name" in fields else f"rule-{index}"
    what = f"rule {name!r}"
    action = _rule_action(fields, what, line)
    kwargs: dict[str, Any] = {"name": name, "action": action, "line": line}
    if "reason" in fields:
        kwargs["reason"] = _string(fields["reason"], f"{what} reason")
    kwargs.update(_rule_fix(fields, what, line))
    if "on_fix_error" in fields:
        kwargs["on_fix_error"] = _on_fix_error(fields["on_fix_error"], what)
    if "archive_payload" in fields:
        kwargs["archive_payload"] = _bool(fields["archive_payload"], f"{what} archive_payload")
    if "fix_timeout_seconds" in fields:
        kwargs["fix_timeout_seconds"] = _fix_timeout(fields["fix_timeout_seconds"], what)
    if "match" in fields:
        kwargs.update(_parse_match(fields["match"], what))
    return Rule(**kwargs)


def _rule_action(fields: dict[str, yaml.Node], what: str, line: int) -> str:
    """The rule's action, with none of the keys that only other actions take (:data:`_ACTION_KEYS`)."""
    if "action" not in fields:
        raise _Invalid(f"{what} has no `action`; use one of {', '.join(outcomes.ACTIONS)}", line)
    action = _string(fields["action"], f"{what} action")
    if action not in outcomes.ACTIONS:
        raise _Invalid(
            f"{what}: unknown action {action!r}; use one of {', '.join(outcomes.ACTIONS)}",
            _line(fields["action"]),
        )
    for key in _ACTION_ONLY_KEYS:
        if key in fields and key not in _ACTION_KEYS[action]:
            raise _Invalid(f"{what}: `{key}` does not apply to action {action!r}", _line(fields[key]))
    return action


def _rule_fix(fields: dict[str, yaml.Node], what: str, line: int) -> dict[str, str]:
    """``fix`` and ``fix_version``, given together or not at all (empty without a fix)."""
    if "fix" not in fields:
        if "fix_version" in fields:
            raise _Invalid(f"{what}: `fix_version` without `fix`", _line(fields["fix_version"]))
        return {}
    fix = _string(fields["fix"], f"{what} fix")
    if not _FIX_REF.fullmatch(fix):
        raise _Invalid(
            f"{what}: fix {fix!r} must be `module:function` (e.g. orders_fixes:add_currency)",
            _line(fields["fix"]),
        )
    if "fix_version" not in fields:
        raise _Invalid(f"{what}: a fix needs `fix_version` (recorded in REPLAY_FIX and the ledger)", line)
    return {"fix": fix, "fix_version": _string(fields["fix_version"], f"{what} fix_version")}


def _on_fix_error(node: yaml.Node, what: str) -> str:
    on_error = _string(node, f"{what} on_fix_error")
    if on_error not in outcomes.ON_FIX_ERROR_CHOICES:
        raise _Invalid(
            f"{what}: on_fix_error must be one of "
            f"{', '.join(outcomes.ON_FIX_ERROR_CHOICES)}, got {on_error!r}",
            _line(node),
        )
    return on_error


def _fix_timeout(node: yaml.Node, what: str) -> float:
    value = _scalar(node)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not 0 < value <= MAX_FIX_TIMEOUT_S:
        raise _Invalid(
            f"{what}: fix_timeout_seconds must be a number of seconds in (0, {MAX_FIX_TIMEOUT_S:g}]; "
            f"got {value!r}",
            _line(node),
        )
    return float(value)


def _parse_match(node: yaml.Node, what: str) -> dict[str, Any]:
    """The ``Rule`` fields of a rule's ``match:``, each condition read by its :data:`_MATCH_PARSERS` entry."""
    if isinstance(node, yaml.ScalarNode) and _scalar(node) is None:
        return {}
    conditions = _mapping(node, f"{what} match", tuple(_MATCH_PARSERS))
    parsers = _MATCH_PARSERS.items()
    return {name: parse(conditions[key], what) for key, (name, parse) in parsers if key in conditions}


def _match_context_formats(node: yaml.Node, what: str) -> frozenset[str]:
    formats = _strings(node, f"{what} match.context_format")
    for fmt in formats:
        if fmt not in _CONTEXT_FORMATS:
            raise _Invalid(
                f"{what}: unknown context_format {fmt!r}; use one of {', '.join(_CONTEXT_FORMATS)}",
                _line(node),
            )
    return frozenset(formats)


def _match_properties(node: yaml.Node, what: str) -> tuple[PropertyCondition, ...]:
    if not isinstance(node, yaml.MappingNode) or not node.value:
        raise _Invalid(f"{what} match.properties must be a non-empty mapping of property: value", _line(node))
    return tuple(
        _property_condition(_string(key, f"{what} match.properties key"), value, what)
        for key, value in node.value
    )


def _property_condition(key: str, node: yaml.Node, what: str) -> PropertyCondition:
    """``key: value`` (equal) or ``key: re:<regex>`` (full match)."""
    value = _string(node, f"{what} match.properties.{key}")
    if not value.startswith("re:"):
        return PropertyCondition(key, value, None)
    try:
        return PropertyCondition(key, None, re.compile(value[3:]))
    except re.error as exc:
        raise _Invalid(
            f"{what}: match.properties.{key}: invalid regular expression: {exc}", _line(node)
        ) from exc


#: Per ``match:`` condition, in the order they are checked: the ``Rule`` field it sets and its parser.
_MATCH_PARSERS: dict[str, tuple[str, Callable[[yaml.Node, str], Any]]] = {
    "signature": ("signatures", lambda node, what: frozenset(_strings(node, f"{what} match.signature"))),
    "error_class": ("error_class", lambda node, what: _regex(node, f"{what} match.error_class")),
    "error_message": ("error_message", lambda node, what: _regex(node, f"{what} match.error_message")),
    "origin_topic": ("origin_topic", lambda node, what: _topics(node, f"{what} match.origin_topic")),
    "context_format": ("context_formats", _match_context_formats),
    "properties": ("properties", _match_properties),
}
