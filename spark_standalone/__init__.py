"""A Spark standalone cluster (master and workers) on loopback from the installed pyspark, for the fault
suite, the benchmark and a person (``python -m spark_standalone``)."""

from __future__ import annotations

from spark_standalone.cluster import SparkCluster, spark_home

__all__ = ["SparkCluster", "spark_home"]
