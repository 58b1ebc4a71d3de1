"""Pinned versions of the Apache Pulsar standalone broker and the Java it runs on."""

from __future__ import annotations

#: Apache Pulsar version the launcher starts by default (4.0 LTS line). Also in ``pom.xml`` and the
#: docker image tag; a test checks.
PULSAR_VERSION = "4.0.7"
#: The newest Apache Pulsar whose jars (``pulsar-broker`` and its dependencies) resolve from Maven
#: Central here. The integration tests run a stated subset on it (``tests/integration/matrix``).
PULSAR_NEWEST_VERSION = "4.2.4"
#: Every version the test suite runs, LTS first: ``python -m pulsar_standalone classpath --all``
#: resolves their jars.
TESTED_VERSIONS = (PULSAR_VERSION, PULSAR_NEWEST_VERSION)
#: Pulsar >= 3.3 needs Java 21 for the broker (Spark keeps the machine's own JDK).
JAVA_MAJOR = 21
