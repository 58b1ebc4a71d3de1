"""Provider metadata for Airflow's providers manager (entry point ``apache_airflow_provider``).

GENERATED from ``provider.yaml`` by ``python -m airflow_provider_dlq.provider_metadata``: edit the YAML,
then regenerate; never edit this file by hand.
"""

from __future__ import annotations

from typing import Any


def get_provider_info() -> dict[str, Any]:
    """Return the provider description: package, versions, connection type, links, plugin, modules."""
    return {
        "package-name": "airflow-provider-dlq",
        "name": "Pulsar DLQ replay",
        "description": (
            "Batch dead-letter-queue reprocessing for `Apache Pulsar` with `Apache "
            "Spark`: backlog sensors, a replay operator with a report link and a "
            "consumer-side term/retry library."
        ),
        "versions": ["0.1.0"],
        "integrations": [
            {
                "integration-name": "Apache Pulsar DLQ",
                "external-doc-url": "https://pulsar.apache.org/",
                "how-to-guide": [
                    "/docs/connection.md",
                    "/docs/sensor.md",
                    "/docs/operator.md",
                    "/docs/report.md",
                    "/docs/dags.md",
                    "/docs/event-driven.md",
                    "/docs/approval.md",
                    "/docs/canary.md",
                    "/docs/managed-spark.md",
                ],
                "tags": ["apache"],
            }
        ],
        "hooks": [
            {"integration-name": "Apache Pulsar DLQ", "python-modules": ["airflow_provider_dlq.hooks.pulsar"]}
        ],
        "triggers": [
            {
                "integration-name": "Apache Pulsar DLQ",
                "python-modules": [
                    "airflow_provider_dlq.triggers.backlog",
                    "airflow_provider_dlq.triggers.backlog_event",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": "Apache Pulsar DLQ",
                "python-modules": ["airflow_provider_dlq.sensors.backlog"],
            }
        ],
        "operators": [
            {
                "integration-name": "Apache Pulsar DLQ",
                "python-modules": [
                    "airflow_provider_dlq.operators.replay",
                    "airflow_provider_dlq.operators.approval",
                    "airflow_provider_dlq.operators.backlog_watch",
                ],
            }
        ],
        "queues": ["airflow_provider_dlq.queues.pulsar.PulsarMessageQueueProvider"],
        "extra-links": [
            "airflow_provider_dlq.operators.links.DlqReplayReportLink",
            "airflow_provider_dlq.operators.links.SparkApplicationLink",
        ],
        "connection-types": [
            {
                "hook-class-name": "airflow_provider_dlq.hooks.pulsar.PulsarHook",
                "hook-name": "Apache Pulsar",
                "connection-type": "pulsar",
                "ui-field-behaviour": {
                    "hidden-fields": ["schema"],
                    "relabeling": {
                        "host": "Service URL",
                        "port": "Broker port (the Test button needs it)",
                        "login": "OAuth2 client ID",
                        "password": "Token or OAuth2 client secret",
                    },
                    "placeholders": {
                        "host": "pulsar://broker:6650 (or pulsar+ssl://broker:6651, or broker)",
                        "port": "required for Test: the Service URL's port, e.g. 6650",
                        "login": "only for OAuth2 client credentials",
                        "password": "JWT (token auth) or the OAuth2 client secret",
                    },
                },
                "conn-fields": {
                    "admin_url": {
                        "label": "Admin URL",
                        "description": (
                            "Pulsar admin REST base URL, e.g. http://broker:8080. Enables "
                            "msgBacklog and age reads and topic globs."
                        ),
                        "schema": {"type": ["string", "null"]},
                    },
                    "metrics_url": {
                        "label": "Metrics URL",
                        "description": (
                            "Prometheus endpoint, e.g. http://broker:8080/metrics. Used for the "
                            "backlog when no admin URL is set."
                        ),
                        "schema": {"type": ["string", "null"]},
                    },
                    "test_topic": {
                        "label": "Test topic",
                        "description": (
                            "A topic this connection may read (e.g. persistent://tenant/ns/orders-"
                            "DLQ); the Test button looks it up instead of "
                            "persistent://public/default/..., which tenant-scoped credentials "
                            "cannot."
                        ),
                        "schema": {"type": ["string", "null"]},
                    },
                    "use_tls": {
                        "label": "Use TLS",
                        "description": "Build a pulsar+ssl:// URL when Service URL is a bare host name.",
                        "schema": {"type": ["boolean", "null"], "default": False},
                    },
                    "tls_trust_certs_file_path": {
                        "label": "TLS trust certs file",
                        "description": (
                            "CA bundle (PEM) that signed the broker's certificate; a path on every worker."
                        ),
                        "schema": {"type": ["string", "null"]},
                    },
                    "tls_cert_file_path": {
                        "label": "TLS client certificate file",
                        "description": (
                            "Client certificate (PEM) for mutual TLS; with no token or OAuth2 it is"
                            " the authentication (Pulsar AuthenticationTls). A path on every "
                            "worker, triggerer and Spark node."
                        ),
                        "schema": {"type": ["string", "null"]},
                    },
                    "tls_key_file_path": {
                        "label": "TLS client key file",
                        "description": (
                            "Private key (PEM) of the client certificate; a path, never the key itself."
                        ),
                        "schema": {"type": ["string", "null"]},
                    },
                    "tls_allow_insecure_connection": {
                        "label": "Allow insecure TLS",
                        "description": "Accept any broker certificate (tests only).",
                        "schema": {"type": ["boolean", "null"], "default": False},
                    },
                    "oauth2_issuer_url": {
                        "label": "OAuth2 issuer URL",
                        "description": (
                            "Enables OAuth2 client credentials (e.g. https://auth.example.com/); "
                            "the client ID is Login and the secret is Password, or both come from "
                            "the credentials file below."
                        ),
                        "schema": {"type": ["string", "null"]},
                    },
                    "oauth2_audience": {"label": "OAuth2 audience", "schema": {"type": ["string", "null"]}},
                    "oauth2_scope": {"label": "OAuth2 scope", "schema": {"type": ["string", "null"]}},
                    "oauth2_credentials_file": {
                        "label": "OAuth2 credentials file",
                        "description": (
                            'Path of a JSON key file {"client_id": ..., "client_secret": ...} '
                            "readable by the workers (instead of Login and Password)."
                        ),
                        "schema": {"type": ["string", "null"]},
                    },
                },
            }
        ],
        "config": {
            "dlq_replay": {
                "description": (
                    'Serving replay reports from the API server (the operator\'s "DLQ replay report" link).'
                ),
                "options": {
                    "report_roots": {
                        "description": (
                            "Comma-separated output roots (local paths or URIs such as "
                            "s3a://bucket/dlq) the API server may serve reports from. Empty: any "
                            "report.html under a runs/<run id>/ folder that a replay task named in "
                            "its XCom."
                        ),
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "/data/dlq,s3a://dlq-bucket/replay",
                        "default": "",
                    },
                    "report_storage_conn_id": {
                        "description": (
                            "Airflow connection used to read reports from object storage (e.g. "
                            "aws_default for s3a://); empty uses the filesystem's default "
                            "credentials."
                        ),
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "aws_default",
                        "default": "",
                    },
                    "report_max_bytes": {
                        "description": "Largest report the endpoint serves, in bytes.",
                        "version_added": "0.1.0",
                        "type": "integer",
                        "example": "20000000",
                        "default": "20000000",
                    },
                },
            }
        },
    }
