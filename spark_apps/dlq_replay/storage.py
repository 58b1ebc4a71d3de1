"""Every file a run reads or writes, on the driver and in its tasks, through pyarrow.fs: a local path or any
URI pyarrow opens, S3's settings from the AWS environment (``docs/object-storage.md``). Writes are whole."""

from __future__ import annotations

import os
import posixpath
import uuid
from functools import lru_cache
from pathlib import Path
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from spark_apps.dlq_replay.errors import ReplayConfigError

#: Schemes served by pyarrow's S3 file system (Hadoop's names included).
S3_SCHEMES = frozenset({"s3", "s3a", "s3n"})


class StorageError(ReplayConfigError):
    """The output root cannot be used as asked; the message names the fix (exit code 2)."""


def join(root: str, *parts: str) -> str:
    """Join path parts onto a local path or URI with ``/``."""
    base = root if root == "/" else root.rstrip("/")
    return posixpath.join(base, *(part.strip("/") for part in parts))


def local_path(path: str) -> str | None:
    """The local file system path of ``path`` (a plain path or a ``file:`` URI), else ``None``."""
    if path.startswith("/"):
        return path
    if path.startswith("file:"):
        return unquote(urlparse(path).path) or None
    return None


def is_local(path: str) -> bool:
    """True for a local path (absolute or relative) or ``file:`` URI."""
    return local_path(path) is not None or "://" not in path


def qualify_root(root: str) -> str:
    """A local relative path becomes absolute (executors and the driver then agree on it)."""
    if "://" in root or root.startswith("/"):
        return root.rstrip("/") or "/"
    return os.path.abspath(root)


@lru_cache(maxsize=8)
def _s3(endpoint: str | None, region: str | None) -> pafs.FileSystem:
    options: dict[str, object] = {"region": region} if region else {}
    if endpoint:
        parsed = urlparse(endpoint)
        options.update(endpoint_override=parsed.netloc or parsed.path, scheme=parsed.scheme or "https")
    return pafs.S3FileSystem(**options)


@lru_cache(maxsize=8)
def _from_uri(base: str) -> pafs.FileSystem:
    return pafs.FileSystem.from_uri(base)[0]


def filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    """``(file system, path inside it)`` for a local path or URI; file systems are cached per process."""
    if is_local(path):
        return pafs.LocalFileSystem(), os.path.abspath(local_path(path) or path)
    parsed = urlparse(path)
    scheme = parsed.scheme.lower()
    # Hadoop-style stores address a path inside the named cluster; the others (s3, gs, abfs...) a bucket.
    inner = parsed.path if scheme in ("hdfs", "viewfs") else f"{parsed.netloc}{parsed.path}"
    if scheme in S3_SCHEMES:
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None
        return _s3(endpoint, region), inner.rstrip("/")
    return _from_uri(f"{scheme}://{parsed.netloc}"), inner.rstrip("/") or "/"


def check_root(root: str) -> None:
    """Fail at once, naming the fix, when ``root`` cannot be opened (unknown scheme, missing bucket)."""
    try:
        fs, inner = filesystem(root)
        bucket = inner.split("/", 1)[0] if urlparse(root).scheme.lower() in S3_SCHEMES else None
        missing = bucket is not None and fs.get_file_info(bucket).type == pafs.FileType.NotFound
    except Exception as exc:
        raise StorageError(
            f"--output-dir {root}: cannot open it ({type(exc).__name__}: {exc}); use a local path or a URI "
            "pyarrow can open (s3://, s3a://, gs://, hdfs://), with its settings in the environment"
        ) from exc
    if missing:
        raise StorageError(
            f"--output-dir {root}: bucket {bucket!r} does not exist or cannot be seen with these "
            "credentials; create it first, or check AWS_ENDPOINT_URL_S3/AWS_ENDPOINT_URL and the "
            "AWS credentials in the driver's and executors' environment"
        )


def writable(path: str) -> tuple[pafs.FileSystem, str]:
    """:func:`filesystem` of a file about to be written, its local folder created."""
    fs, inner = filesystem(path)
    if is_local(path):
        os.makedirs(os.path.dirname(inner) or ".", exist_ok=True)
    return fs, inner


def exists(path: str) -> bool:
    fs, inner = filesystem(path)
    return bool(fs.get_file_info(inner).type != pafs.FileType.NotFound)


def read_bytes(path: str) -> bytes | None:
    """The file's bytes, or ``None`` when it does not exist."""
    fs, inner = filesystem(path)
    try:
        with fs.open_input_stream(inner) as stream:
            return bytes(stream.read())
    except OSError:  # FileNotFoundError, or a store's own error for a missing object
        if not exists(path):
            return None
        raise


def write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` whole: a local file through a temporary name and a rename; an object in one upload."""
    fs, inner = writable(path)
    if is_local(path):
        tmp = f"{inner}.tmp-{uuid.uuid4().hex}"
        Path(tmp).write_bytes(data)
        os.replace(tmp, inner)  # atomic: a killed process leaves the old file or the new one
        return
    with fs.open_output_stream(inner) as out:
        out.write(data)


def list_names(path: str) -> list[str]:
    """Names of the entries directly under ``path`` (empty when it does not exist)."""
    fs, inner = filesystem(path)
    return sorted(info.base_name for info in fs.get_file_info(pafs.FileSelector(inner, allow_not_found=True)))


def list_files(path: str) -> list[str]:
    """Paths (as ``path``'s scheme writes them) of the files under ``path``, sorted; none if missing."""
    fs, inner = filesystem(path)
    infos = fs.get_file_info(pafs.FileSelector(inner, recursive=True, allow_not_found=True))
    return sorted(join(path, info.path[len(inner) :]) for info in infos if info.type == pafs.FileType.File)


def delete(path: str) -> None:
    """Delete a file or a directory tree; nothing when it does not exist."""
    fs, inner = filesystem(path)
    kind = fs.get_file_info(inner).type
    if kind == pafs.FileType.Directory:
        fs.delete_dir(inner)
    elif kind == pafs.FileType.File:
        fs.delete_file(inner)


def move(src: str, dst: str) -> None:
    """Rename a file, replacing ``dst`` (atomic on a local disk; a copy then a delete on object stores)."""
    fs, inner = filesystem(src)
    fs.move(inner, writable(dst)[1])


def make_dirs(path: str) -> None:
    fs, inner = filesystem(path)
    fs.create_dir(inner, recursive=True)


class RunStorage:
    """Small UTF-8 files of a run (plan, state, report, locks) under any output root."""

    exists = staticmethod(exists)
    delete = staticmethod(delete)
    list_names = staticmethod(list_names)

    def read_text(self, path: str) -> str | None:
        """The file's text, or ``None`` when it does not exist."""
        data = read_bytes(path)
        return None if data is None else data.decode("utf-8")

    def write_text(self, path: str, text: str) -> None:
        """Write ``text`` atomically (see :func:`write_bytes`)."""
        write_bytes(path, text.encode("utf-8"))

    def create_exclusive(self, path: str, text: str) -> bool:
        """Create ``path`` holding ``text`` unless it exists (local files only); True when this call did."""
        if not is_local(path):
            raise StorageError(
                f"{path}: an exclusive create is not available on this store; keep --subscription-lease on "
                "(the default), which guards the run on object storage"
            )
        try:
            with open(writable(path)[1], "x", encoding="utf-8") as handle:  # O_CREAT | O_EXCL
                handle.write(text)
        except FileExistsError:
            return False
        return True


def move_tree(src: str, dst: str) -> None:
    """Replace the folder ``dst`` with ``src``: a rename on a local disk; elsewhere a move per file, which
    a re-run after a kill finishes (``dst`` is emptied only before the first file moves)."""
    if is_local(src) and is_local(dst):
        delete(dst)
        os.replace(filesystem(src)[1], writable(dst)[1])
        return
    files = list_files(src)
    if not files:
        return  # moved whole by an earlier call
    started = join(src, "_MOVING")  # marks a folder begun to move file by file
    if started not in files:
        delete(dst)
        write_bytes(started, b"")
    for path in files:
        if path != started:
            move(path, join(dst, path[len(src.rstrip("/")) :]))
    delete(src)


def open_parquet(path: str, **options: object) -> pq.ParquetFile:
    """A Parquet file for reading (its metadata, row groups, batches) on any store."""
    fs, inner = filesystem(path)
    return pq.ParquetFile(fs.open_input_file(inner), **options)


def read_table(path: str, columns: list[str] | None = None) -> pa.Table:
    """A whole Parquet file as a table."""
    return open_parquet(path).read(columns=columns, use_threads=False)


def write_table(table: pa.Table, path: str) -> None:
    """Write ``table`` as one Parquet file, whole (a temporary name, then :func:`move`)."""
    temp = join(posixpath.dirname(path), f"_tmp-{uuid.uuid4().hex}.parquet")
    fs, inner = writable(temp)
    pq.write_table(table, inner, filesystem=fs)
    move(temp, path)
