"""Find and read a replay run's ``report.html`` for the API server, wherever the Spark driver wrote it.

The location comes from the replay task's XCom summary (``paths.report_html``): a local path or
``file://`` URI is read from the API server's file system (a volume shared with the Spark driver, e.g.
``/data/dlq`` in ``docker/``); any other scheme (``s3a://``, ``gs://``, ``abfs://``, ``hdfs://`` ...) is
read like the operator reads ``report.json`` (:mod:`airflow_provider_dlq.output_storage`: the Airflow
object-storage filesystem a provider registers for that scheme, else pyarrow's), with
``[dlq_replay] report_storage_conn_id``.

Only files named ``report.html`` inside a ``runs/<run id>/`` folder are ever served, and, when
``[dlq_replay] report_roots`` is set, only under one of those roots: an XCom value cannot turn the
endpoint into a file reader.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from airflow_provider_dlq.errors import DlqProviderError
from airflow_provider_dlq.output_storage import (
    OutputStorageError,
    OutputTooLarge,
    OutputUnsupported,
    read_bytes,
    split_location,
)

REPORT_NAME = "report.html"
DEFAULT_MAX_BYTES = 20_000_000


class ReportUnavailable(DlqProviderError):
    """The report cannot be served; ``status`` is the HTTP status, the message says why and what to do."""

    def __init__(self, message: str, status: int = 404) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class StoreSettings:
    """``[dlq_replay]`` settings of the endpoint."""

    roots: tuple[str, ...] = ()
    conn_id: str | None = None
    max_bytes: int = DEFAULT_MAX_BYTES


def report_location(summary: Any) -> str:
    """``paths.report_html`` of a replay task's XCom summary, or :class:`ReportUnavailable`."""
    paths = summary.get("paths") if isinstance(summary, dict) else None
    location = paths.get("report_html") if isinstance(paths, dict) else None
    if not isinstance(location, str) or not location.strip():
        raise ReportUnavailable(
            "this task instance has no replay report: the task did not finish a replay run (its XCom "
            "return_value has no paths.report_html); see the task log"
        )
    return location.strip()


def _split(location: str) -> tuple[str, str]:
    """``(scheme, path)``; local paths and ``file://`` URIs give scheme ``""``."""
    return split_location(location)


def check_shape(location: str) -> None:
    """Refuse anything but ``.../runs/<run id>/report.html`` (no ``..``)."""
    _, path = _split(location)
    normalised = posixpath.normpath(urlsplit(path).path if "://" in path else path)
    parts = normalised.split("/")
    if parts[-1:] != [REPORT_NAME] or len(parts) < 3 or parts[-3] != "runs" or ".." in path.split("/"):
        raise ReportUnavailable(
            f"refusing to serve {location!r}: only <output dir>/runs/<run id>/{REPORT_NAME} files are served",
            status=403,
        )


def _under(location: str, root: str) -> bool:
    scheme, path = _split(location)
    root_scheme, root_path = _split(root.strip())
    if scheme != root_scheme:
        return False
    if not scheme:
        return Path(path).resolve().is_relative_to(Path(root_path).resolve())
    return path.rstrip("/").startswith(root_path.rstrip("/") + "/")


def check_roots(location: str, roots: tuple[str, ...]) -> None:
    if roots and not any(_under(location, root) for root in roots if root.strip()):
        raise ReportUnavailable(
            f"refusing to serve {location!r}: it is under none of [dlq_replay] report_roots "
            f"({', '.join(roots)}); add its output dir there",
            status=403,
        )


def read_report(location: str, settings: StoreSettings) -> bytes:
    """The bytes of the report at ``location`` (checked), or :class:`ReportUnavailable` with the fix."""
    check_shape(location)
    check_roots(location, settings.roots)
    try:
        return read_bytes(location, settings.conn_id, settings.max_bytes)
    except FileNotFoundError as exc:
        if _split(location)[0]:
            raise ReportUnavailable(f"the report {location} does not exist (yet)") from exc
        raise ReportUnavailable(
            f"the report {location} is not on the API server's file system; the Spark driver wrote it "
            "on its own machine. Share the output dir with the API server at the same path (a volume "
            "or network file system), or use an object store (s3a://...) as output_dir"
        ) from exc
    except OutputTooLarge as exc:
        message = f"the report {location} is larger than [dlq_replay] report_max_bytes"
        raise ReportUnavailable(message, 413) from exc
    except OutputUnsupported as exc:
        raise ReportUnavailable(f"the API server {exc}; or open the report from the storage", 501) from exc
    except OutputStorageError as exc:
        raise ReportUnavailable(f"{exc}; check [dlq_replay] report_storage_conn_id", 502) from exc
