"""An S3-compatible server on loopback: moto's server mode (``python -m moto.server``) in a child process.

For the tests (the ``s3_server`` fixture), the benchmark and a person (``python -m spark_standalone
s3``). The server keeps everything in memory; it runs in its own session, is killed if the process that
started it dies, and is stopped by PID; its log is in a private temp dir, deleted with it. It accepts
any keys; :attr:`S3Server.env` holds the test keys, the region and the endpoint as the standard AWS
variables, which is all an S3 client needs (boto3, pyarrow's ``S3FileSystem`` through the replay app's
storage layer, the AWS SDKs)::

    server = S3Server()
    endpoint = server.start()  # http://127.0.0.1:<port>
    server.bucket("dlq")  # created with boto3
    subprocess.run([...], env={**os.environ, **server.env})  # s3://dlq/... from the child
    server.stop()
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pulsar_standalone import free_port, kill_when_parent_dies
from spark_standalone.server_process import ServerProcess

#: Test keys (moto accepts any; these make a leaked value easy to spot in a log).
ACCESS_KEY_ID = "AKIAMOTOTESTKEY00001"
SECRET_ACCESS_KEY = "moto-secret-never-logged-0123456789"
REGION = "us-east-1"


@dataclass
class S3Server(ServerProcess):
    """moto's S3 server on 127.0.0.1; see the module docstring."""

    host: str = "127.0.0.1"
    access_key_id: str = ACCESS_KEY_ID
    secret_access_key: str = SECRET_ACCESS_KEY
    region: str = REGION
    start_timeout_s: float = 60.0
    endpoint: str = ""
    #: Seconds :meth:`start` took until the server answered.
    started_in_s: float = 0.0

    def start(self) -> str:
        """Start the server on a free port; returns its endpoint (``http://127.0.0.1:<port>``) once it
        answers."""
        if self.process is not None:
            raise RuntimeError("this S3 server is already started; stop() it first")
        started = time.monotonic()
        self.root = Path(tempfile.mkdtemp(prefix="s3-server-"))
        try:
            port = free_port()
            self.endpoint = f"http://{self.host}:{port}"
            self.log_path = self.root / "moto.log"
            self._log = self.log_path.open("ab")
            self.process = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(port)],
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=kill_when_parent_dies,
            )
            self._wait()
        except BaseException:
            self.stop()
            raise
        self.started_in_s = time.monotonic() - started
        return self.endpoint

    # ----------------------------------------------------------------- for clients
    @property
    def env(self) -> dict[str, str]:
        """The standard AWS variables a client in another process needs (keys, region, endpoint)."""
        if not self.endpoint:
            raise RuntimeError("start() the S3 server first")
        return {
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_REGION": self.region,
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            "AWS_EC2_METADATA_DISABLED": "true",  # no instance-metadata lookups on a developer machine
        }

    def client(self) -> Any:
        """A boto3 S3 client of this server (its own keys, not the caller's environment)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            region_name=self.region,
        )

    def bucket(self, name: str) -> str:
        """Create bucket ``name`` (nothing happens when it exists); returns its name."""
        client = self.client()
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every object key of ``bucket`` under ``prefix``, sorted."""
        paginator = self.client().get_paginator("list_objects_v2")
        return sorted(
            obj["Key"]
            for page in paginator.paginate(Bucket=bucket, Prefix=prefix)
            for obj in page.get("Contents", [])
        )

    # ----------------------------------------------------------------- internals
    def _wait(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.start_timeout_s
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"moto's S3 server exited with code {self.process.returncode} while starting; its log "
                    f"ends:\n{self.tail()}"
                )
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2).close()
                return
            except (OSError, urllib.error.URLError) as exc:
                last = str(exc)
            time.sleep(0.1)
        raise RuntimeError(
            f"timed out after {self.start_timeout_s:.0f} s waiting for moto's S3 server at {self.endpoint} "
            f"({last}); its log ends:\n{self.tail()}"
        )
