"""Checks before anything is written: what guards the run on an object store, the output root, Arrow UDFs."""

from __future__ import annotations

import pytest

from spark_apps.dlq_replay.cli import parse_options
from spark_apps.dlq_replay.errors import ReplayConfigError
from spark_apps.dlq_replay.preflight import check_local, check_output_dir

BASE = ["--run-id", "r1", "--service-url", "pulsar://localhost:6650", "--topics", "a-DLQ"]


def test_an_object_store_root_without_the_lease_is_refused_before_any_work(monkeypatch):
    from spark_apps.dlq_replay import preflight

    touched: list[str] = []
    monkeypatch.setattr(preflight, "check_root", lambda root: touched.append(root))
    options = parse_options([*BASE, "--output-dir", "s3://bucket/dlq", "--subscription-lease", "off"])
    with pytest.raises(ReplayConfigError) as info:
        check_local(options)
    message = str(info.value)
    assert "--subscription-lease off needs a local --output-dir, got s3://bucket/dlq" in message
    assert "Keep --subscription-lease on (the default)" in message
    assert touched == []  # refused before the store is even opened


def test_a_local_root_may_run_without_the_lease(tmp_path):
    options = parse_options([*BASE, "--output-dir", str(tmp_path / "out"), "--subscription-lease", "off"])
    check_local(options)


def test_an_output_root_that_cannot_be_opened_is_a_usage_error():
    with pytest.raises(ReplayConfigError, match=r"--output-dir nosuchscheme://x/y: cannot open it"):
        check_output_dir("nosuchscheme://x/y", "runs/r1")


def test_a_driver_without_pandas_is_told_the_fix(monkeypatch, tmp_path):
    import pyspark.sql.pandas.utils as utils
    from pyspark.errors import PySparkImportError

    def missing() -> None:
        raise PySparkImportError(
            errorClass="PACKAGE_NOT_INSTALLED",
            messageParameters={"package_name": "Pandas", "minimum_version": "2.2.0"},
        )

    monkeypatch.setattr(utils, "require_minimum_pandas_version", missing)
    with pytest.raises(ReplayConfigError, match=r"install pandas in the driver's environment"):
        check_local(parse_options([*BASE, "--output-dir", str(tmp_path / "out")]))
