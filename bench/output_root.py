"""Where this project's runs write their output root (``--output-dir``): a local folder, or a bucket of an
S3 server on loopback (moto, :class:`spark_standalone.S3Server`).

``--output-root s3`` gives every run of the replay app a fresh S3 server, started before the clock and
stopped after verification (it keeps everything in memory, so nothing outlives the run): the app writes
its whole run directory, archive and ledger to ``s3://dlq-bench/<run>``. The server's keys, region and
endpoint reach spark-submit, a cluster's workers and a Connect server through their environment (the
standard AWS variables), never their arguments. The harness reads the report, archive and ledger back
through pyarrow's file systems, with the server's settings given explicitly (its own environment has
none of them).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

if TYPE_CHECKING:
    import pyarrow.fs as pafs

LOG = logging.getLogger("bench")

#: Output roots of ``--output-root``.
OUTPUT_ROOTS = ("local", "s3")
ROOT_LABELS = {"local": "local disk", "s3": "S3 (moto on loopback)"}
BUCKET = "dlq-bench"


@dataclass(frozen=True)
class OutputRoot:
    """An output root: ``kind`` (``local`` or ``s3``), its URI, and the environment a process needs to
    open it (the AWS variables of the S3 server; empty for a local folder)."""

    kind: str
    uri: str
    env: dict[str, str] = field(default_factory=dict, repr=False)

    def filesystem(self, location: str) -> tuple[pafs.FileSystem, str]:
        """``(file system, path inside it)`` of ``location`` (a path or URI the app wrote)."""
        import pyarrow.fs as pafs

        parsed = urlparse(location)
        if parsed.scheme in ("s3", "s3a", "s3n"):
            return s3_filesystem(self.env), f"{parsed.netloc}{parsed.path}".rstrip("/")
        if parsed.scheme == "file":
            return pafs.LocalFileSystem(), unquote(parsed.path)
        if parsed.scheme:
            raise ValueError(f"{location!r}: the benchmark reads local paths and s3:// URIs only")
        return pafs.LocalFileSystem(), location

    def read_bytes(self, location: str) -> bytes | None:
        """The file's bytes, or ``None`` when there is no such file."""
        fs, inner = self.filesystem(location)
        try:
            with fs.open_input_stream(inner) as stream:
                return bytes(stream.read())
        except FileNotFoundError:
            return None

    def count_parquet_rows(self, location: str, *, run_id: str | None = None) -> int:
        """Rows of the Parquet dataset at ``location`` (of one ``run_id`` column value when given); 0 when
        there is none (a run with nothing to archive or record writes no dataset)."""
        import pyarrow.dataset as ds
        import pyarrow.fs as pafs

        fs, inner = self.filesystem(location)
        if fs.get_file_info(inner).type == pafs.FileType.NotFound:
            return 0
        dataset = ds.dataset(inner, filesystem=fs, format="parquet", partitioning="hive")
        if run_id is not None and "run_id" in dataset.schema.names:
            return int(dataset.count_rows(filter=ds.field("run_id") == run_id))
        return int(dataset.count_rows())


def s3_filesystem(env: dict[str, str]) -> pafs.FileSystem:
    """pyarrow's S3 file system for the keys, region and endpoint of ``env`` (the standard AWS variables,
    as the replay app's storage layer reads them from its own environment)."""
    import pyarrow.fs as pafs

    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    options: dict[str, object] = {
        "access_key": env.get("AWS_ACCESS_KEY_ID"),
        "secret_key": env.get("AWS_SECRET_ACCESS_KEY"),
        "region": env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION"),
    }
    if endpoint:
        parsed = urlparse(endpoint)
        options["endpoint_override"] = parsed.netloc or parsed.path
        options["scheme"] = parsed.scheme or "https"
    return pafs.S3FileSystem(**{k: v for k, v in options.items() if v})


def local_root(workdir: Path) -> OutputRoot:
    """``workdir/out`` as an absolute path (as the app qualifies a relative ``--output-dir``)."""
    return OutputRoot("local", os.path.abspath(workdir / "out"))


@contextlib.contextmanager
def output_root(kind: str, workdir: Path, name: str) -> Iterator[OutputRoot]:
    """The output root of one run: ``workdir/out``, or ``s3://dlq-bench/<name>`` on a fresh S3 server
    (stopped by PID when the block ends)."""
    if kind == "local":
        yield local_root(workdir)
        return
    if kind != "s3":
        raise ValueError(f"unknown output root {kind!r}; choose from {', '.join(OUTPUT_ROOTS)}")
    from spark_standalone import S3Server

    with S3Server() as server:
        server.start()
        server.bucket(BUCKET)
        LOG.info("S3 server (moto) at %s, output root s3://%s/%s", server.endpoint, BUCKET, name)
        yield OutputRoot("s3", f"s3://{BUCKET}/{name}", server.env)
