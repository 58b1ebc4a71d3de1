"""The DLQ replay Spark application (plan, snapshot, decide, apply, record, commit, report); it imports
no Airflow, so it runs from the ``--py-files`` bundle on any Python with pyspark, pyarrow, pulsar-client."""

from __future__ import annotations
