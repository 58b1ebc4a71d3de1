"""Pinned versions of the Apache Pulsar standalone broker and the Java it runs on."""

from __future__ import annotations

#: Apache Pulsar version (4.0 LTS line). Also in ``pom.xml`` and the docker image tag; a test checks.
PULSAR_VERSION = "4.0.7"
#: Pulsar >= 3.3 needs Java 21 for the broker (Spark keeps the machine's own JDK).
JAVA_MAJOR = 21
