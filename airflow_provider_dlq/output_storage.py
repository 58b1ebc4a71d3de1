"""Read a file under a replay run's output root: local, Airflow object storage, else pyarrow's file systems
(``docs/object-storage.md``). Credentials are never logged or returned."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from airflow_provider_dlq.errors import DlqProviderError
from pulsar_dlq_consumer.replay_options import SUMMARY_PREFIX

if TYPE_CHECKING:
    import logging

    from airflow.sdk.types import Logger
    from pyarrow.fs import FileSystem

#: Hadoop's S3 connector names (``s3a://`` is what Spark writes) and the S3 API they all speak.
S3_SCHEMES = ("s3", "s3a", "s3n")
#: Schemes pyarrow opens natively when no Airflow provider registers them.
ARROW_SCHEMES = (*S3_SCHEMES, "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss")


class OutputStorageError(DlqProviderError):
    """A file under the output root cannot be read; the message says why and what to do."""


class OutputUnsupported(OutputStorageError):
    """No file system here can open the location's scheme."""


class OutputTooLarge(OutputStorageError):
    """The file is larger than the caller's limit."""


class ReportNotFound(OutputStorageError, RuntimeError):
    """The run's report is neither at its output root nor in the app's stdout."""


def split_location(location: str) -> tuple[str, str]:
    """``(scheme, path)``; local paths and ``file://`` URIs give scheme ``""`` and a local path."""
    parts = urlsplit(location)
    if parts.scheme in ("", "file") or (len(parts.scheme) == 1 and location[1:3] in (":/", ":\\")):
        return "", unquote(parts.path) if parts.scheme == "file" else location
    return parts.scheme.lower(), location


def read_bytes(location: str, conn_id: str | None = None, max_bytes: int | None = None) -> bytes:
    """The bytes of ``location``; :class:`FileNotFoundError` when it does not exist."""
    scheme, path = split_location(location)
    if not scheme:
        file = Path(path)
        if not file.is_file():
            raise FileNotFoundError(location)
        _check_size(location, file.stat().st_size, max_bytes)
        return file.read_bytes()
    from airflow.sdk.io.fs import has_fs

    if has_fs(scheme):
        read, hint = _read_airflow, f"check connection {conn_id!r}"
    elif scheme in ARROW_SCHEMES:
        read, hint = _read_arrow, f"check the credentials of {conn_id!r} or the AWS_* / cloud environment"
    else:
        raise OutputUnsupported(
            f"cannot read {scheme}:// here: no Airflow object-storage filesystem is registered for it and "
            f"pyarrow opens only {', '.join(ARROW_SCHEMES)}; install the Airflow provider that registers "
            f"{scheme}:// (see docs/managed-spark.md) or use an output_dir this machine can read"
        )
    try:
        return read(scheme, location, conn_id, max_bytes)
    except (FileNotFoundError, OutputTooLarge):
        raise
    except Exception as exc:
        raise OutputStorageError(f"reading {location} failed: {type(exc).__name__}: {exc}; {hint}") from exc


def _check_size(location: str, size: int | None, max_bytes: int | None) -> None:
    if max_bytes is not None and size is not None and size > max_bytes:
        raise OutputTooLarge(f"{location} is {size} bytes, more than the limit of {max_bytes}")


def _read_airflow(scheme: str, location: str, conn_id: str | None, max_bytes: int | None) -> bytes:
    from airflow.sdk import ObjectStoragePath

    path = ObjectStoragePath(location, conn_id=conn_id)
    _check_size(location, path.stat().st_size, max_bytes)
    with path.open("rb") as handle:
        return bytes(handle.read())


def s3_options(conn_id: str | None, environ: dict[str, str] | None = None) -> dict[str, Any]:
    """``pyarrow.fs.S3FileSystem`` arguments from an ``aws`` connection, else the environment."""
    env = os.environ if environ is None else environ
    options: dict[str, Any] = {}
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if conn_id:
        from airflow.sdk import BaseHook

        conn = BaseHook.get_connection(conn_id)
        extra = conn.extra_dejson
        if conn.login and conn.password:
            options["access_key"], options["secret_key"] = conn.login, conn.password
            if extra.get("aws_session_token"):
                options["session_token"] = extra["aws_session_token"]
        s3_config = (extra.get("service_config") or {}).get("s3") or {}
        endpoint = s3_config.get("endpoint_url") or extra.get("endpoint_url") or endpoint
        region = extra.get("region_name") or region
    if endpoint:
        options["endpoint_override"] = endpoint
    if region:
        options["region"] = region
    return options


def arrow_filesystem(scheme: str, location: str, conn_id: str | None) -> tuple[FileSystem, str]:
    """A pyarrow file system for ``location`` and the path inside it."""
    from pyarrow import fs

    if scheme in S3_SCHEMES:
        parts = urlsplit(location)
        return fs.S3FileSystem(**s3_options(conn_id)), f"{parts.netloc}{parts.path}"
    return fs.FileSystem.from_uri(location)


def _read_arrow(scheme: str, location: str, conn_id: str | None, max_bytes: int | None) -> bytes:
    filesystem, path = arrow_filesystem(scheme, location, conn_id)
    info = filesystem.get_file_info(path)
    if info.type.name == "NotFound":
        raise FileNotFoundError(location)
    _check_size(location, info.size, max_bytes)
    with filesystem.open_input_stream(path) as handle:
        return bytes(handle.read())


def read_run_report(
    location: str, run_id: str, summary_line: str | None, conn_id: str | None, log: Logger | logging.Logger
) -> dict[str, Any]:
    """The report at ``location``; else the summary line; else :class:`ReportNotFound` naming the fix."""
    problem = "it does not exist"
    try:
        return dict(json.loads(read_bytes(location, conn_id)))
    except FileNotFoundError:
        pass
    except OutputStorageError as exc:
        problem = str(exc)
        log.warning("report.json of run %s is not readable from the worker: %s", run_id, problem)
    if summary_line:
        log.info("Using the app's summary line for run %s (report.json at %s not read)", run_id, location)
        return dict(json.loads(summary_line[len(SUMMARY_PREFIX) :]))
    raise ReportNotFound(
        f"spark-submit finished but no report was found at {location} ({problem}) and the app printed no "
        f"{SUMMARY_PREFIX.strip()} line; check the Spark driver log of run {run_id!r}, and that "
        "storage_conn_id (or the worker's environment) can read the output_dir."
    )
