"""What could be a token is never shown in the replay app's output (``docs/reliability.md#secrets``);
:func:`scrub`, the last line of defence, removes registered secrets, JWTs and URL credentials from logs."""

from __future__ import annotations

import itertools
import re
import threading
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from spark_apps.dlq_replay.errors import ReplayConfigError

if TYPE_CHECKING:
    from collections.abc import Iterable

NOT_SHOWN = "(value not shown)"
#: How a secret is replaced in a scrubbed text.
MASK = "***"
_JWT = re.compile(r"eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}(?:\.[A-Za-z0-9_-]*)?")
_HEX = re.compile(r"[0-9a-fA-F]{32,}")
#: Runs of letters and digits long enough to be a random secret (base64 or base62 between separators).
_ALNUM_RUN = re.compile(r"[A-Za-z0-9]{16,}")
#: A random run switches between upper case, lower case and digits at most characters (about 60 %);
#: words, CamelCase names and dates far less (``ProcessOrderEvents2024``: 29 %).
_MIN_SWITCH_RATE = 0.4
#: ``scheme://user:password@`` and ``?query``/``#fragment`` of URLs inside a text.
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@'\"]+@")
_URL_QUERY = re.compile(r"(?P<url>[A-Za-z][A-Za-z0-9+.-]*://[^\s?#'\"]*)[?#][^\s'\"]*")
#: Words that make an option name look like it carries a secret (compared without case, ``_`` as ``-``).
SECRET_WORDS = ("token", "secret", "password", "passwd", "jwt", "credential", "auth-param")


def _random_looking(run: str) -> bool:
    """Mixed case and digits (at least two of each) that switch class like random characters do."""
    classes = [0 if c.isdigit() else 1 if c.isupper() else 2 for c in run]
    if min(classes.count(0), classes.count(1), classes.count(2)) < 2:
        return False
    return sum(a != b for a, b in itertools.pairwise(classes)) >= _MIN_SWITCH_RATE * (len(run) - 1)


def could_be_secret(value: object) -> bool:
    """A JWT, a long hex string, or a run of 16+ letters and digits mixing classes as random ones do."""
    text = str(value)
    if _JWT.search(text) or _HEX.search(text):
        return True
    return any(_random_looking(match.group()) for match in _ALNUM_RUN.finditer(text))


def shown(value: object) -> str:
    """``value`` quoted for a message, or ``(value not shown)`` when it could be a secret."""
    return NOT_SHOWN if could_be_secret(value) else repr(value)


def safe_url(url: str) -> str:
    """``url`` without credentials, query or fragment (``http://u:p@h:1/x?t=1`` -> ``http://h:1/x``)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return NOT_SHOWN
    if not parts.scheme or not host:
        return NOT_SHOWN
    netloc = f"[{host}]" if ":" in host else host
    netloc = f"{netloc}:{port}" if port is not None else netloc
    return f"{parts.scheme}://{netloc}{'' if could_be_secret(parts.path) else parts.path}"


def check_url(option: str, url: str, schemes: tuple[str, ...], example: str, what: str = "URL") -> None:
    """Refuse ``url`` unless it is a plain ``scheme://host[:port][/path]`` of ``schemes`` (never shown)."""
    fix = (
        "pass the token by the PULSAR_AUTH_TOKEN environment variable or --auth-token-file PATH (OAuth2: "
        "--oauth2-credentials-file or PULSAR_OAUTH2_CREDENTIALS), and rotate it if it was typed in a shell"
    )
    if not url.startswith(schemes):
        raise ReplayConfigError(
            f"{option} must start with {' or '.join(schemes)}: the {what}, e.g. {example} (value not shown)"
        )
    if "@" in url.split("://", 1)[1].split("/", 1)[0]:  # user:password@ before the host
        raise ReplayConfigError(
            f"{option} must not carry credentials (user:password@ before the host; value not shown): {fix}"
        )
    if "?" in url or "#" in url:
        raise ReplayConfigError(
            f"{option} must not carry a query or fragment (?...; value not shown), which could hold a token: "
            f"{fix}"
        )
    if could_be_secret(url.split("://", 1)[1]):
        raise ReplayConfigError(
            f"{option} holds something that looks like a token {NOT_SHOWN}; give the plain URL, e.g. "
            f"{example}, and {fix}"
        )


def check_name(option: str, value: str) -> None:
    """Refuse a name the run writes to files and the broker when it could be a secret."""
    if could_be_secret(value):
        raise ReplayConfigError(
            f"{option} looks like a token {NOT_SHOWN}, not a name; the run would write it to its files "
            "and to the broker. Give the intended name; a Pulsar token goes in the PULSAR_AUTH_TOKEN "
            "environment variable or --auth-token-file PATH (rotate it if it was typed in a shell)"
        )


_LOCK = threading.Lock()
_REGISTERED: set[str] = set()


def register(values: Iterable[str | None]) -> None:
    """Remember secrets (or values that could be) so that :func:`scrub` removes them from any text."""
    with _LOCK:
        _REGISTERED.update(v for v in values if v and len(v) >= 8)


def names_secret(arg: str) -> bool:
    """True when ``arg`` is an option (``--x`` or ``--x=value``) named for a secret (:data:`SECRET_WORDS`)."""
    name = arg.partition("=")[0].lower().replace("_", "-")
    return arg.startswith("-") and any(word in name for word in SECRET_WORDS)


def register_argv(argv: Iterable[str]) -> None:
    """Register every argument that could be a secret, and the value of every option named for one."""
    items = list(argv)
    found: list[str] = []
    for i, arg in enumerate(items):
        _, sep, value = arg.partition("=")
        if could_be_secret(arg):
            found.append(value if sep and arg.startswith("-") else arg)
        if names_secret(arg):
            if sep:
                found.append(value)
            elif i + 1 < len(items) and not items[i + 1].startswith("--"):
                found.append(items[i + 1])
    register(found)


def scrub(text: str) -> str:
    """``text`` with every registered secret, JWT and URL credential or query replaced by ``***``."""
    with _LOCK:
        registered = sorted(_REGISTERED, key=len, reverse=True)
    for secret in registered:
        text = text.replace(secret, MASK)
    text = _JWT.sub(MASK, text)
    text = _URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{MASK}@", text)
    return _URL_QUERY.sub(lambda m: f"{m.group('url')}?{MASK}", text)
