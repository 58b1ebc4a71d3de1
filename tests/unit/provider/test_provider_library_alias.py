"""The consumer library's former import path inside the provider: an alias that warns, for one release."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest


def test_old_import_path_warns_and_aliases_the_library() -> None:
    for name in [m for m in sys.modules if m.startswith("airflow_provider_dlq.dlq_consumer")]:
        del sys.modules[name]
    with pytest.warns(DeprecationWarning, match="import pulsar_dlq_consumer instead"):
        old = importlib.import_module("airflow_provider_dlq.dlq_consumer")
    import pulsar_dlq_consumer
    from pulsar_dlq_consumer import context

    assert old.DlqConsumer is pulsar_dlq_consumer.DlqConsumer
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from airflow_provider_dlq.dlq_consumer.context import parse_error_context
    assert parse_error_context is context.parse_error_context
