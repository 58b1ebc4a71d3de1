"""Small text files of a run (plan, state, report) on any Hadoop-compatible file system.

The output root may be a local path or a URI (``hdfs://``, ``s3a://``, ``file:///``...). Local files are
read and written with Python (a write is a temporary file and ``os.replace``, atomic even if the driver
is killed mid-write); anything else goes through Spark's Hadoop ``FileSystem`` on the driver, so
whatever Spark can write to works here too.
"""

from __future__ import annotations

import os
import posixpath
import uuid
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def join(root: str, *parts: str) -> str:
    """Join path parts onto a local path or URI with ``/``."""
    out = root.rstrip("/") if root not in ("/",) else root
    for part in parts:
        out = posixpath.join(out, part.strip("/"))
    return out


def local_path(path: str) -> str | None:
    """The local file system path of ``path`` (a plain path or a ``file:`` URI), else ``None``."""
    if path.startswith("/"):
        return path
    if path.startswith("file:"):
        from urllib.parse import unquote, urlparse

        return unquote(urlparse(path).path) or None
    return None


def qualify_root(root: str) -> str:
    """A local relative path becomes absolute (executors and the driver then agree on it)."""
    if "://" in root or root.startswith("/"):
        return root.rstrip("/") or "/"
    return os.path.abspath(root)


class RunStorage:
    """Read and write small UTF-8 files through the JVM's Hadoop ``FileSystem``."""

    def __init__(self, spark: SparkSession) -> None:
        self._spark = spark
        jvm: Any = spark.sparkContext._jvm
        self._jvm = jvm
        self._conf = spark.sparkContext._jsc.hadoopConfiguration()

    def _fs(self, path: str) -> tuple[Any, Any]:
        jpath = self._jvm.org.apache.hadoop.fs.Path(path)
        fs = jpath.getFileSystem(self._conf)
        fs.setWriteChecksum(False)
        return fs, jpath

    def exists(self, path: str) -> bool:
        fs, jpath = self._fs(path)
        return bool(fs.exists(jpath))

    def read_text(self, path: str) -> str | None:
        """The file's text, or ``None`` when it does not exist."""
        local = local_path(path)
        if local is not None:
            try:
                with open(local, encoding="utf-8") as handle:
                    return handle.read()
            except FileNotFoundError:
                return None
        fs, jpath = self._fs(path)
        if not fs.exists(jpath):
            return None
        stream = fs.open(jpath)
        try:
            text = self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
        finally:
            stream.close()
        return str(text)

    def write_text(self, path: str, text: str) -> None:
        """Write ``text`` atomically where the file system can: a temporary file, then a rename."""
        local = local_path(path)
        if local is not None:
            os.makedirs(os.path.dirname(local) or ".", exist_ok=True)
            tmp = f"{local}.tmp-{uuid.uuid4().hex}"
            with open(tmp, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(tmp, local)  # atomic: a killed driver leaves the old file or the new one
            return
        fs, jpath = self._fs(path)
        parent = jpath.getParent()
        if parent is not None and not fs.exists(parent):
            fs.mkdirs(parent)
        tmp = self._jvm.org.apache.hadoop.fs.Path(f"{path}.tmp-{uuid.uuid4().hex}")
        out = fs.create(tmp, True)
        try:
            out.write(bytearray(text.encode("utf-8")))
        finally:
            out.close()
        if self._rename_over(tmp, jpath):
            return
        # File systems without an atomic overwriting rename: replace in two steps.
        if fs.exists(jpath):
            fs.delete(jpath, False)
        if not fs.rename(tmp, jpath):
            fs.delete(tmp, False)
            raise OSError(f"could not rename {tmp} to {path}; check the output directory is writable")

    def _rename_over(self, src: Any, dst: Any) -> bool:
        """Rename replacing ``dst`` (``FileContext`` with ``Rename.OVERWRITE``; atomic on HDFS)."""
        hadoop_fs = self._jvm.org.apache.hadoop.fs
        gateway: Any = self._spark.sparkContext._gateway
        try:
            context = hadoop_fs.FileContext.getFileContext(dst.toUri(), self._conf)
            options = gateway.new_array(hadoop_fs.Options.Rename, 1)
            options[0] = hadoop_fs.Options.Rename.OVERWRITE
            context.rename(src, dst, options)
        except Exception:  # e.g. no AbstractFileSystem for the scheme: fall back
            return False
        return True

    def delete(self, path: str) -> None:
        fs, jpath = self._fs(path)
        if fs.exists(jpath):
            fs.delete(jpath, True)

    def list_names(self, path: str) -> list[str]:
        """Names of the entries directly under ``path`` (empty when it does not exist)."""
        fs, jpath = self._fs(path)
        if not fs.exists(jpath):
            return []
        return [str(status.getPath().getName()) for status in fs.listStatus(jpath)]

    def create_exclusive(self, path: str, text: str) -> bool:
        """Create ``path`` holding ``text`` unless it exists; True when this call created it.

        Atomic where the file system's ``create(overwrite=false)`` is (HDFS, local); object stores
        without conditional writes can let two callers both succeed.
        """
        fs, jpath = self._fs(path)
        try:
            out = fs.create(jpath, False)
        except Exception as exc:  # FileAlreadyExistsException through py4j
            if "AlreadyExists" in type(exc).__name__ or "AlreadyExists" in str(exc):
                return False
            raise
        try:
            out.write(bytearray(text.encode("utf-8")))
        finally:
            out.close()
        return True

    def has_data(self, path: str) -> bool:
        """True when ``path`` is a directory holding a Spark ``_SUCCESS`` marker or any file."""
        fs, jpath = self._fs(path)
        if not fs.exists(jpath):
            return False
        return bool(fs.listStatus(jpath))
