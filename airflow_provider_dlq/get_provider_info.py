"""Provider metadata read by Airflow's providers manager (entry point ``apache_airflow_provider``)."""

from __future__ import annotations

from typing import Any

from airflow_provider_dlq import __version__

INTEGRATION = "Apache Pulsar DLQ"


def get_provider_info() -> dict[str, Any]:
    """Return the provider description: package, versions, connection type and modules."""
    return {
        "package-name": "airflow-provider-dlq",
        "name": "Pulsar DLQ replay",
        "description": "Batch dead-letter-queue reprocessing for `Apache Pulsar` with `Apache Spark`: "
        "backlog sensors, a replay operator and a consumer-side term/retry library.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": INTEGRATION,
                "external-doc-url": "https://pulsar.apache.org/",
                "tags": ["apache"],
            }
        ],
        "hooks": [{"integration-name": INTEGRATION, "python-modules": ["airflow_provider_dlq.hooks.pulsar"]}],
        "triggers": [
            {
                "integration-name": INTEGRATION,
                "python-modules": [
                    "airflow_provider_dlq.triggers.backlog",
                    "airflow_provider_dlq.triggers.backlog_event",
                ],
            }
        ],
        "sensors": [
            {"integration-name": INTEGRATION, "python-modules": ["airflow_provider_dlq.sensors.backlog"]}
        ],
        "operators": [
            {
                "integration-name": INTEGRATION,
                "python-modules": [
                    "airflow_provider_dlq.operators.replay",
                    "airflow_provider_dlq.operators.approval",
                    "airflow_provider_dlq.operators.backlog_watch",
                ],
            }
        ],
        "queues": ["airflow_provider_dlq.queues.pulsar.PulsarMessageQueueProvider"],
        "connection-types": [
            {
                "hook-class-name": "airflow_provider_dlq.hooks.pulsar.PulsarHook",
                "hook-name": "Apache Pulsar",
                "connection-type": "pulsar",
                "ui-field-behaviour": {
                    "hidden-fields": ["schema", "login"],
                    "relabeling": {"host": "Service URL or host", "password": "Token"},
                    "placeholders": {
                        "host": "pulsar://localhost:6650 (or pulsar+ssl://broker:6651)",
                        "port": "6650",
                        "password": "JWT token (optional)",
                    },
                },
                "conn-fields": {
                    "admin_url": {
                        "label": "Admin URL",
                        "description": "Pulsar admin REST base URL, e.g. http://localhost:8080. "
                        "Enables msgBacklog/age reads and namespace patterns.",
                        "schema": {"type": ["string", "null"]},
                    },
                    "metrics_url": {
                        "label": "Metrics URL",
                        "description": "Prometheus endpoint, e.g. http://localhost:8080/metrics. "
                        "Used for backlog when no admin URL is set.",
                        "schema": {"type": ["string", "null"]},
                    },
                    "use_tls": {
                        "label": "Use TLS",
                        "description": "Build a pulsar+ssl:// URL when Host is a bare host name.",
                        "schema": {"type": ["boolean", "null"], "default": False},
                    },
                    "tls_trust_certs_file_path": {
                        "label": "TLS trust certs file",
                        "schema": {"type": ["string", "null"]},
                    },
                    "tls_allow_insecure_connection": {
                        "label": "Allow insecure TLS",
                        "schema": {"type": ["boolean", "null"], "default": False},
                    },
                },
            }
        ],
    }
