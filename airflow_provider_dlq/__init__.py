"""Apache Airflow provider for batch DLQ reprocessing of Apache Pulsar topics with Apache Spark.

Importing this package is cheap: it imports neither Airflow nor Spark. Import the subpackages you need."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
