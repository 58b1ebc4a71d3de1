"""Consumer-side term/retry library for Apache Pulsar: Term, retry topics, delay levels, backoff, DLQ context.

Pure Python over ``pulsar-client`` (imported lazily); it never imports Airflow.
"""

from __future__ import annotations

from pulsar_dlq_consumer.backoff import ConstantBackoff, ExponentialBackoff, RedeliveryBackoff
from pulsar_dlq_consumer.client import create_client
from pulsar_dlq_consumer.consumer import DlqConsumer
from pulsar_dlq_consumer.context import (
    CONTEXT_FIELDS,
    ErrorContext,
    base_topic,
    build_context_properties,
    detect_format,
    error_context_values,
    is_bookkeeping_property,
    parse_error_context,
    strip_bookkeeping_properties,
)
from pulsar_dlq_consumer.conventions import CONTEXT_PREFIX, ContextFormat
from pulsar_dlq_consumer.delays import DEFAULT_DELAY_LEVELS, MAX_DELAY_SECONDS, MIN_DELAY_SECONDS, DelayLevels
from pulsar_dlq_consumer.errors import (
    ConfigurationError,
    ConsumerClosedError,
    DlqConsumerError,
    DlqNotConfiguredError,
    InvalidDelayError,
    PublishError,
    RetryableError,
    RetryNotConfiguredError,
    TerminalError,
    TopicNameGuardError,
    UnsupportedSubscriptionTypeError,
)
from pulsar_dlq_consumer.metrics import ConsumerMetrics
from pulsar_dlq_consumer.policy import LEVEL_INCREMENT, DeadLetterPolicy, RetryPolicy, TopicNameGuard
from pulsar_dlq_consumer.processing import MessageProcessor, Outcome, ProcessingStats

__all__ = [
    "CONTEXT_FIELDS",
    "CONTEXT_PREFIX",
    "DEFAULT_DELAY_LEVELS",
    "LEVEL_INCREMENT",
    "MAX_DELAY_SECONDS",
    "MIN_DELAY_SECONDS",
    "ConfigurationError",
    "ConstantBackoff",
    "ConsumerClosedError",
    "ConsumerMetrics",
    "ContextFormat",
    "DeadLetterPolicy",
    "DelayLevels",
    "DlqConsumer",
    "DlqConsumerError",
    "DlqNotConfiguredError",
    "ErrorContext",
    "ExponentialBackoff",
    "InvalidDelayError",
    "MessageProcessor",
    "Outcome",
    "ProcessingStats",
    "PublishError",
    "RedeliveryBackoff",
    "RetryNotConfiguredError",
    "RetryPolicy",
    "RetryableError",
    "TerminalError",
    "TopicNameGuard",
    "TopicNameGuardError",
    "UnsupportedSubscriptionTypeError",
    "base_topic",
    "build_context_properties",
    "create_client",
    "detect_format",
    "error_context_values",
    "is_bookkeeping_property",
    "parse_error_context",
    "strip_bookkeeping_properties",
]
