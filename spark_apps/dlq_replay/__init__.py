"""The DLQ replay Spark application: plan, snapshot, decide, apply, record, commit and report.

Nothing in this package imports Airflow: it runs from the ``--py-files`` bundle on any Python that has
pyspark, pyarrow and pulsar-client.
"""

from __future__ import annotations
