"""Spark and object storage on loopback from the installed packages, for the test suite, the benchmark and
a person (``python -m spark_standalone [cluster|connect|s3]``): a Spark standalone cluster (master and
workers), a Spark Connect server, and an S3-compatible server (moto)."""

from __future__ import annotations

from spark_standalone.cluster import SparkCluster, spark_home
from spark_standalone.connect import ConnectServer
from spark_standalone.s3 import S3Server

__all__ = ["ConnectServer", "S3Server", "SparkCluster", "spark_home"]
