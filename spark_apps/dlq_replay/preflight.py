"""Checks that run before a replay writes anything (:func:`check_local` needs no Spark): bad input exits 2
and leaves no run directory. Values that could be a secret (the token file path) are never echoed."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from spark_apps.dlq_replay.arrow_util import require_arrow_udfs
from spark_apps.dlq_replay.errors import ReplayConfigError
from spark_apps.dlq_replay.fixes import load_fix
from spark_apps.dlq_replay.group_actions import reuse_window
from spark_apps.dlq_replay.lock import check_guard
from spark_apps.dlq_replay.playbook import Playbook, load_playbook
from spark_apps.dlq_replay.run_context import run_dir_name
from spark_apps.dlq_replay.session import add_pyfile
from spark_apps.dlq_replay.storage import RunStorage, check_root, join, local_path, qualify_root

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark_apps.dlq_replay.options import ReplayOptions

log = logging.getLogger("spark_apps.dlq_replay")
#: A token or OAuth2 credentials file larger than this holds more than a secret.
MAX_TOKEN_FILE_BYTES = 64 * 1024
_PEM_CERT = (b"-----BEGIN CERTIFICATE-----", "PEM certificate (-----BEGIN CERTIFICATE-----)")
_PEM_KEY = (b"PRIVATE KEY-----", "PEM private key (-----BEGIN ... PRIVATE KEY-----)")
#: The PEM files an option names: the option, the marker the file must hold, what that is, and the fix.
_PEM_FILES = (
    ("--tls-trust-certs-file", *_PEM_CERT, "give the CA bundle in PEM format"),
    ("--tls-cert-file", *_PEM_CERT, "give the client certificate in PEM format"),
    ("--tls-key-file", *_PEM_KEY, "give the key in PEM format"),
)


def _read_head(path: str, option: str, limit: int = MAX_TOKEN_FILE_BYTES + 1) -> bytes:
    """The first ``limit`` bytes of ``path``; the error never shows the path (it could be a token)."""
    if os.path.isdir(path):
        raise ReplayConfigError(f"the path given as {option} is a directory (path not shown); give a file")
    try:
        with open(path, "rb") as handle:
            return handle.read(limit)
    except OSError as exc:
        raise ReplayConfigError(
            f"the file given as {option} cannot be read ({exc.strerror}; path not shown, as it could be a "
            "token typed in the wrong place); give the path of a readable file"
        ) from exc


def check_files(options: ReplayOptions) -> None:
    """The token, OAuth2 credentials and TLS files are readable and hold what they should (never echoed)."""
    if options.auth_token_file:
        data = _read_head(options.auth_token_file, "--auth-token-file")
        if not data.strip():
            raise ReplayConfigError(
                "the file given as --auth-token-file is empty; write the JWT token into it"
            )
        if len(data) > MAX_TOKEN_FILE_BYTES:
            raise ReplayConfigError(
                f"the file given as --auth-token-file is larger than {MAX_TOKEN_FILE_BYTES // 1024} KiB; it "
                "must hold only the JWT token"
            )
    for option, marker, what, fix in _PEM_FILES:
        path = getattr(options, option[2:].replace("-", "_"))
        if path and marker not in _read_head(path, option, 4 * 1024 * 1024):
            raise ReplayConfigError(f"the file given as {option} holds no {what}; {fix}")
    if options.oauth2_credentials_file:
        data = _read_head(options.oauth2_credentials_file, "--oauth2-credentials-file")
        try:
            parsed = json.loads(data.decode("utf-8")) if len(data) <= MAX_TOKEN_FILE_BYTES else None
        except ValueError:  # UnicodeDecodeError and JSONDecodeError too
            parsed = None
        if not isinstance(parsed, dict) or not parsed.get("client_id") or not parsed.get("client_secret"):
            raise ReplayConfigError(
                "the file given as --oauth2-credentials-file is not a JSON object with client_id and "
                f"client_secret of at most {MAX_TOKEN_FILE_BYTES // 1024} KiB (content not shown); write the "
                'client credentials JSON ({"client_id": ..., "client_secret": ...}) into it'
            )


def _probe(directory: Path, output_dir: str, cannot: str, fix: str) -> None:
    """Create and remove a directory in ``directory``: the only check that holds for every user (root too)."""
    try:
        Path(tempfile.mkdtemp(prefix=".dlq-replay-probe-", dir=directory)).rmdir()
    except OSError as exc:
        raise ReplayConfigError(f"--output-dir {output_dir}: {cannot} ({exc.strerror}); {fix}") from exc


def check_output_dir(given: str, run_dir: str) -> None:
    """The output root and the parts of it the run writes can be created and written (probed, not made)."""
    root = qualify_root(given)
    local = local_path(root)
    if local is None:
        check_root(root)  # a StorageError is a ReplayConfigError
        storage, probe = RunStorage(), join(root, f".dlq-replay-probe-{uuid.uuid4().hex}")
        try:
            storage.write_text(probe, "probe")
        except Exception as exc:  # the store's error names the cause (permissions, credentials, bucket)
            raise ReplayConfigError(
                f"--output-dir {given}: cannot write there ({type(exc).__name__}: {str(exc)[:300]}); "
                "check the URI, credentials and permissions"
            ) from exc
        with contextlib.suppress(Exception):
            storage.delete(probe)
        return
    existing = Path(local)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ReplayConfigError(f"--output-dir {given}: {existing} is not a directory; give a directory path")
    if existing != Path(local):
        _probe(existing, given, f"cannot create it in {existing}", "give a writable location")
        return
    for part in ("", "runs", "ledger", "archive", "locks", run_dir):
        directory = existing / part
        if directory.exists():
            if not directory.is_dir():
                raise ReplayConfigError(f"--output-dir {given}: {directory} is not a directory; move it away")
            fix = "give a directory this user can write to, or fix its permissions"
            _probe(directory, given, f"cannot write in {directory}", fix)


def check_local(options: ReplayOptions) -> Playbook:
    """Every check that needs no Spark; returns the validated playbook."""
    check_files(options)
    if options.playbook:
        playbook = load_playbook(options.playbook)
        fixes = ", ".join(playbook.fixes) or "none"
        log.info("playbook %s: %d rules, fixes: %s", options.playbook, len(playbook.rules), fixes)
    else:
        playbook = Playbook()
        log.info("no --playbook: every message will be skipped (left pending)")
    require_arrow_udfs()  # every step runs Arrow UDFs
    check_guard(options.output_dir, options.subscription_lease)
    check_output_dir(options.output_dir, join("runs", run_dir_name(options.run_id)))
    if options.window_from:  # the reviewed run's plan: same topics and subscription
        reuse_window(options)
    return playbook


def ship_and_load_fixes(spark: SparkSession, playbook: Playbook) -> None:
    """Ship the playbook's fix files to the session's Python workers and import every fix on the driver."""
    for fix_file in playbook.fix_files:
        try:
            add_pyfile(spark, fix_file)
        except Exception as exc:  # e.g. another file of the same name was shipped to this session
            raise ReplayConfigError(
                f"fix_files entry {fix_file}: cannot add it to the Spark session ({type(exc).__name__}: "
                f"{str(exc)[:300]}); a different file of the same name may already be in this session: "
                "give the fix module a name of its own"
            ) from exc
    for ref in playbook.fixes:
        load_fix(ref)  # raises FixLoadError (exit 2) naming the fix
