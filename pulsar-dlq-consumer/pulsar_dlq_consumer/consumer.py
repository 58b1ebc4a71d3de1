"""A Pulsar consumer wrapper with Term, retry topics, delay levels, nack backoff and DLQ error context."""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, wait
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from pulsar_dlq_consumer.backoff import ExponentialBackoff, RedeliveryBackoff, checked_delay
from pulsar_dlq_consumer.context import base_topic, build_context_properties
from pulsar_dlq_consumer.conventions import (
    CONTEXT_PREFIX,
    DELAY_TIME,
    ORIGIN_MESSAGE_ID,
    PULSAR_STANDARD_KEYS,
    REAL_TOPIC,
    REASON_MAX_RECONSUMES,
    REASON_MAX_REDELIVERIES,
    REASON_TERM,
    RECONSUMETIMES,
    RETRY_TOPIC,
    read_int,
)
from pulsar_dlq_consumer.errors import (
    ConfigurationError,
    ConsumerClosedError,
    DlqNotConfiguredError,
    InvalidDelayError,
    PublishError,
    RetryNotConfiguredError,
    UnsupportedSubscriptionTypeError,
)
from pulsar_dlq_consumer.metrics import ConsumerMetrics, topic_attributes
from pulsar_dlq_consumer.policy import DeadLetterPolicy, RetryPolicy, check_count, resolve_topics

if TYPE_CHECKING:
    import pulsar

#: What failed (an exception or a message), a retry delay, level and extra properties, as methods take them.
Failure: TypeAlias = BaseException | str | None
Delay: TypeAlias = float | timedelta | None
Level: TypeAlias = int | Literal["increment"] | None
Properties: TypeAlias = Mapping[str, str] | None
log = logging.getLogger(__name__)

#: ``subscribe`` options the wrapper manages itself.
_MANAGED_OPTIONS = ("consumer_type", "consumer_name", "negative_ack_redelivery_delay_ms", "message_listener")


class _Scheduler:
    """A daemon thread running actions when due: delayed nacks (PIP-106 backoff), acks after async sends."""

    def __init__(self, name: str) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def schedule(self, delay: float, action: Callable[[], None]) -> None:
        """Run ``action`` in ``delay`` seconds; once closing, at once on the caller's thread."""
        with self._cond:
            if not self._closing:
                heapq.heappush(self._heap, (time.monotonic() + delay, next(self._seq), action))
                self._cond.notify()
                return
        action()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._heap and (self._closing or self._heap[0][0] <= time.monotonic())):
                    if self._closing:
                        return
                    self._cond.wait(self._heap[0][0] - time.monotonic() if self._heap else None)
                _, _, action = heapq.heappop(self._heap)
            try:
                action()
            except Exception:
                log.exception("dlq_consumer: a scheduled ack/nack failed; the broker will redeliver")

    def close(self, timeout: float) -> None:
        """Run everything still scheduled at once, then stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)


class DlqConsumer:
    """Consume a topic with Term, retry topics, nack backoff and DLQ error context (names as in ``pulsar``;
    docs/consumer-library.md); ``send_timeout_s``: how long a copy's confirmation is awaited."""

    def __init__(
        self,
        client: pulsar.Client,
        topic: str,
        subscription_name: str,
        *,
        dead_letter_policy: DeadLetterPolicy | None = None,
        retry_policy: RetryPolicy | None = None,
        backoff: RedeliveryBackoff | None = None,
        consumer_type: pulsar.ConsumerType | None = None,
        consumer_name: str | None = None,
        metrics: ConsumerMetrics | None = None,
        nack_precision_ms: int = 10,
        send_timeout_s: float = 30.0,
        **subscribe_options: Any,
    ) -> None:
        import pulsar

        consumer_type = consumer_type if consumer_type is not None else pulsar.ConsumerType.Shared
        backoff = backoff if backoff is not None else ExponentialBackoff()
        _check_arguments(dead_letter_policy, retry_policy, backoff, consumer_type, subscribe_options)
        check_count("nack_precision_ms", nack_precision_ms, 1)
        if not isinstance(send_timeout_s, int | float) or send_timeout_s <= 0:
            raise ConfigurationError(f"send_timeout_s must be > 0; got {send_timeout_s!r}")
        self._topic, self.dead_letter_topic, self.retry_topic = resolve_topics(
            topic, subscription_name, dead_letter_policy, retry_policy
        )
        self._pulsar = pulsar
        self._client = client
        self._subscription = subscription_name
        self.dead_letter_policy = dead_letter_policy
        self.retry_policy = retry_policy
        self.backoff = backoff
        self._metrics = metrics if metrics is not None else ConsumerMetrics()
        self._attributes = topic_attributes(self._topic, self._subscription)
        self._send_timeout_s = float(send_timeout_s)
        self._lock = threading.Lock()
        self._producers: dict[str, Any] = {}
        self._inflight: set[Future[Any]] = set()
        self._closed = False
        options: dict[str, Any] = {
            "consumer_type": consumer_type,
            "consumer_name": consumer_name,
            "negative_ack_redelivery_delay_ms": nack_precision_ms,
            **subscribe_options,
        }
        # With retry, two single-topic consumers feed one bounded inbox (pulsar-client's multi-topic consumer
        # logs payloads); the listener blocks while the inbox is full.
        self._inbox: queue.Queue[Any] = queue.Queue(maxsize=int(options.get("receiver_queue_size", 1000)))
        self._retry_consumer: Any = None
        if self.retry_topic is not None:
            options["message_listener"] = self._listen
        self._consumer = client.subscribe(self._topic, subscription_name, **options)
        if self.retry_topic is not None:
            try:
                self._retry_consumer = client.subscribe(self.retry_topic, subscription_name, **options)
            except Exception:
                self._closed = True
                self._consumer.close()
                raise
        self._scheduler = _Scheduler(f"dlq-consumer-{self._subscription}")

    def _listen(self, consumer: Any, msg: Any) -> None:
        """Put ``msg`` in the inbox (listener thread); once closed it stays unacked for redelivery."""
        while not self._closed:
            with contextlib.suppress(queue.Full):
                self._inbox.put(msg, timeout=0.2)
                return

    @property
    def consumer(self) -> pulsar.Consumer:
        """The underlying ``pulsar.Consumer`` of the topic (with retry, do not call its ``receive``)."""
        return self._consumer

    def _owner(self, msg: pulsar.Message) -> Any:
        """The underlying consumer that received ``msg``: the only one that may ack or nack it."""
        return self._retry_consumer if self.is_retry_message(msg) else self._consumer

    def topic(self) -> str:
        """The consumed topic, fully qualified, as ``pulsar.Consumer.topic()``."""
        return self._topic

    def subscription_name(self) -> str:
        """The subscription name, as ``pulsar.Consumer.subscription_name()``."""
        return self._subscription

    def consumer_name(self) -> str:
        """Name of the underlying consumer, as ``pulsar.Consumer.consumer_name()``."""
        return str(self._consumer.consumer_name())

    def _check_open(self) -> None:
        if self._closed:
            raise ConsumerClosedError("this DlqConsumer is closed; create a new one")

    def is_retry_message(self, msg: pulsar.Message) -> bool:
        """True if ``msg`` was received from this consumer's retry topic."""
        return self.retry_topic is not None and base_topic(msg.topic_name()) == self.retry_topic

    def receive(self, timeout_millis: int | None = None) -> pulsar.Message:
        """Receive the next message; one redelivered past ``max_redeliver_count`` goes to the DLQ instead."""
        self._check_open()
        deadline = None if timeout_millis is None else time.monotonic() + timeout_millis / 1000
        while True:
            remaining = None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
            msg = self._consumer.receive(remaining) if self._retry_consumer is None else self._take(remaining)
            policy = self.dead_letter_policy
            if policy is None or msg.redelivery_count() <= policy.max_redeliver_count:
                return msg
            self._dead_letter(msg, REASON_MAX_REDELIVERIES, None, wait=True)

    def _take(self, timeout_millis: int | None) -> pulsar.Message:
        """The next message of the inbox; without a timeout, wait until one arrives or the consumer closes."""
        try:
            while timeout_millis is None:
                with contextlib.suppress(queue.Empty):
                    return self._inbox.get(timeout=0.5)
                if self._closed:
                    raise queue.Empty
            return self._inbox.get(timeout=timeout_millis / 1000)
        except queue.Empty:
            raise self._pulsar.Timeout(f"no message within {timeout_millis} ms") from None

    def acknowledge(self, msg: pulsar.Message) -> None:
        """Acknowledge ``msg`` (processed)."""
        self._check_open()
        self._owner(msg).acknowledge(msg)

    def negative_acknowledge(self, msg: pulsar.Message, error: Failure = None) -> None:
        """Redeliver ``msg`` after ``backoff.next(redelivery_count)`` seconds, or past ``max_redeliver_count``
        send it to the DLQ with ``error``'s context (``InvalidDelayError``/``PublishError``: nacked first)."""
        self._check_open()
        count = msg.redelivery_count()
        policy = self.dead_letter_policy
        if policy is not None and count >= policy.max_redeliver_count:
            self._dead_letter(msg, REASON_MAX_REDELIVERIES, error, wait=True)
            return
        owner = self._owner(msg)
        try:
            delay = checked_delay(self.backoff, count)
        except InvalidDelayError:
            owner.negative_acknowledge(msg)
            raise
        self._metrics.nacks.add(1, self._attributes)
        self._scheduler.schedule(delay, lambda: owner.negative_acknowledge(msg))

    def term(self, msg: pulsar.Message, error: Failure = None) -> pulsar.MessageId:
        """Send ``msg`` straight to the DLQ with reason ``term`` (PIP-372), then ack it; returns the DLQ id.
        ``DlqNotConfiguredError`` leaves the message unacknowledged; on ``PublishError`` it is nacked."""
        return self._term(msg, error, wait=True).result()

    def term_async(self, msg: pulsar.Message, error: Failure = None) -> Future[Any]:
        """:meth:`term` without waiting: the future completes after the DLQ write and the ack (a failed
        send nacks the original and fails the future); :meth:`close` waits for them."""
        return self._term(msg, error, wait=False)

    def _term(self, msg: pulsar.Message, error: Failure, *, wait: bool) -> Future[Any]:
        self._check_open()
        if self.dead_letter_policy is None:
            raise DlqNotConfiguredError(
                f"{'term()' if wait else 'term_async()'} needs a dead-letter topic: create the consumer with "
                "dead_letter_policy=DeadLetterPolicy(...) (the message was left unacknowledged)"
            )
        return self._dead_letter(msg, REASON_TERM, error, wait=wait)

    def reconsume_later(
        self,
        msg: pulsar.Message,
        delay: Delay = None,
        *,
        level: Level = None,
        properties: Properties = None,
        error: Failure = None,
    ) -> pulsar.MessageId:
        """Redeliver ``msg`` later through the retry topic, then ack it; returns the id written. ``delay``
        (seconds or a timedelta) or ``level`` (1-based, or ``"increment"``); neither: the policy's default."""
        return self._reconsume(msg, delay, level, properties, error, wait=True).result()

    def reconsume_later_async(
        self,
        msg: pulsar.Message,
        delay: Delay = None,
        *,
        level: Level = None,
        properties: Properties = None,
        error: Failure = None,
    ) -> Future[Any]:
        """Like :meth:`reconsume_later` without waiting for the broker (see :meth:`term_async`)."""
        return self._reconsume(msg, delay, level, properties, error, wait=False)

    def _reconsume(
        self, msg: pulsar.Message, delay: Delay, level: Level, extra: Properties, error: Failure, wait: bool
    ) -> Future[Any]:
        self._check_open()
        retry, retry_topic = self.retry_policy, self.retry_topic
        if retry is None or retry_topic is None:
            raise RetryNotConfiguredError(
                "reconsume_later() needs a retry topic: create the consumer with "
                "retry_policy=RetryPolicy(...) and dead_letter_policy=DeadLetterPolicy(...) "
                "(the message was left unacknowledged)"
            )
        if extra is not None and not (
            isinstance(extra, Mapping)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in extra.items())
        ):
            raise ConfigurationError(f"properties must map str to str; got {extra!r}")
        attempt = _reconsume_times(msg) + 1
        if attempt > retry.max_reconsumes:
            return self._dead_letter(msg, REASON_MAX_RECONSUMES, error, wait=wait)
        seconds = retry.resolve_delay(attempt, delay=delay, level=level)
        props = {
            **(extra or {}),
            **self._copy_properties(msg, reason=None, error=error, reconsume_times=attempt),
            RECONSUMETIMES: str(attempt),
            DELAY_TIME: str(round(seconds * 1000)),
            RETRY_TOPIC: retry_topic,
        }
        sent = self._send(msg, retry_topic, msg.data(), props, timedelta(seconds=seconds))
        return self._complete(msg, sent, wait, lambda: self._metrics.retries.add(1, self._attributes))

    def _dead_letter(self, msg: pulsar.Message, reason: str, error: Failure, *, wait: bool) -> Future[Any]:
        assert self.dead_letter_policy is not None
        assert self.dead_letter_topic is not None
        props = self._copy_properties(msg, reason=reason, error=error, reconsume_times=_reconsume_times(msg))
        payload = msg.data() if self.dead_letter_policy.copy_payload else b""

        def done() -> None:
            self._metrics.dlq_messages.add(1, {**self._attributes, "reason": reason})
            if reason == REASON_TERM:
                self._metrics.terms.add(1, self._attributes)

        return self._complete(msg, self._send(msg, self.dead_letter_topic, payload, props, None), wait, done)

    def _copy_properties(
        self, msg: pulsar.Message, *, reason: str | None, error: Failure, reconsume_times: int
    ) -> dict[str, str]:
        """Original properties without old bookkeeping, plus fresh context."""
        policy = self.dead_letter_policy
        assert policy is not None  # retry needs a dead-letter policy too
        original = msg.properties()
        retried = self.is_retry_message(msg)
        origin_topic = (original.get(REAL_TOPIC) if retried else msg.topic_name()) or self._topic
        origin_id = (original.get(ORIGIN_MESSAGE_ID) if retried else None) or str(msg.message_id())
        kept = {
            k: v
            for k, v in original.items()
            if k not in PULSAR_STANDARD_KEYS and not k.startswith(CONTEXT_PREFIX)
        }
        context = build_context_properties(
            origin_topic=origin_topic,
            origin_message_id=origin_id,
            subscription=self._subscription,
            reason=reason,
            delivery_count=msg.redelivery_count() + 1,
            reconsume_times=reconsume_times,
            error=error,
            include_stacktrace=policy.include_stacktrace,
            consumer=self.consumer_name(),
            failed_at=int(time.time() * 1000),
            payload=msg.data(),
            payload_copied=policy.copy_payload or reason is None,
            max_message_bytes=policy.max_error_message_bytes,
            max_stack_bytes=policy.max_stacktrace_bytes,
        )
        return {**kept, **context}

    def _producer_for(self, topic: str) -> Any:
        with self._lock:
            if topic in self._producers:
                return self._producers[topic]
            policy = self.dead_letter_policy
            if topic == self.dead_letter_topic and policy is not None and policy.initial_subscription_name:
                # A durable subscription retains DLQ messages until someone reads them.
                self._client.subscribe(
                    topic,
                    policy.initial_subscription_name,
                    consumer_type=self._pulsar.ConsumerType.Shared,
                    initial_position=self._pulsar.InitialPosition.Earliest,
                ).close()
            self._producers[topic] = self._client.create_producer(
                topic, batching_enabled=True, batching_max_publish_delay_ms=5, block_if_queue_full=True
            )
            return self._producers[topic]

    def _send(
        self, msg: pulsar.Message, topic: str, payload: bytes, props: dict[str, str], after: timedelta | None
    ) -> Future[Any]:
        """Copy ``msg`` to ``topic`` (``after``: a delivery delay); a future of the new id or PublishError."""
        sent: Future[Any] = Future()

        def failed(detail: object) -> PublishError:
            return PublishError(
                f"writing message {msg.message_id()} to {topic} failed: {detail}; the original was not "
                "acknowledged and is redelivered (if the message is too big, use copy_payload=False or "
                "smaller properties)"
            )

        def callback(result: Any, message_id: Any) -> None:
            if result == self._pulsar.Result.Ok:
                sent.set_result(message_id)
            else:
                sent.set_exception(failed(result))

        kwargs: dict[str, Any] = {"properties": props}
        for name in ("partition_key", "ordering_key", "event_timestamp"):
            if value := getattr(msg, name)():
                kwargs[name] = value
        if after is not None:
            kwargs["deliver_after"] = after
        with self._lock:
            self._inflight.add(sent)
        sent.add_done_callback(self._forget)
        try:
            self._producer_for(topic).send_async(payload, callback, **kwargs)
        except Exception as exc:
            if not sent.done():
                sent.set_exception(failed(repr(exc)))
        return sent

    def _complete(
        self, msg: pulsar.Message, sent: Future[Any], wait: bool, on_done: Callable[[], None]
    ) -> Future[Any]:
        """Ack ``msg`` only once ``sent`` succeeded (a crash in between duplicates, never loses), else nack it
        at once; with ``wait`` on the caller's thread (raising the send's :class:`PublishError`), else on the
        scheduler thread."""
        owner = self._owner(msg)
        done: Future[Any] = Future()

        def settle(_: object = None) -> None:
            error = sent.exception()
            if error is not None:
                owner.negative_acknowledge(msg)
                done.set_exception(error)
            else:
                owner.acknowledge(msg)
                on_done()
                done.set_result(sent.result())

        if not wait:
            # The callback runs on the client's I/O thread: only hand the ack/nack to the scheduler thread.
            sent.add_done_callback(lambda _: self._scheduler.schedule(0, settle))
            return done
        try:
            sent.exception(timeout=self._send_timeout_s)
        except TimeoutError:  # concurrent.futures.TimeoutError since Python 3.11
            owner.negative_acknowledge(msg)
            raise PublishError(
                f"no confirmation within {self._send_timeout_s:g} s for message {msg.message_id()}; "
                "the original was nacked (it may arrive twice, never zero times)"
            ) from None
        settle()
        done.result()  # a failed send raises its PublishError here
        return done

    def _forget(self, future: Future[Any]) -> None:
        with self._lock:
            self._inflight.discard(future)

    def flush(self, timeout: float | None = None) -> None:
        """Flush the DLQ/retry producers and wait until every async send made so far has been confirmed."""
        with self._lock:
            producers = list(self._producers.values())
            pending = list(self._inflight)
        for producer in producers:
            producer.flush()
        unconfirmed = wait(pending, timeout if timeout is not None else self._send_timeout_s).not_done
        if unconfirmed:
            raise PublishError(f"{len(unconfirmed)} DLQ/retry sends still unconfirmed after flush timeout")

    def close(self) -> None:
        """Flush and close the producers, hand back held nacks, and close the consumer. Idempotent."""
        if self._closed:
            return
        try:
            self.flush()
        except PublishError:
            log.warning("dlq_consumer: closing with unconfirmed sends; their originals stay unacknowledged")
        self._scheduler.close(timeout=self._send_timeout_s)
        self._closed = True  # messages still in the inbox stay unacked: the broker redelivers them
        with self._lock:
            producers = list(self._producers.values())
            self._producers.clear()
        for producer in producers:
            try:
                producer.close()
            except Exception:
                log.warning("dlq_consumer: closing a DLQ/retry producer failed", exc_info=True)
        if self._retry_consumer is not None:
            self._retry_consumer.close()
        self._consumer.close()

    def __enter__(self) -> DlqConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_arguments(
    dead_letter: object, retry: object, backoff: object, consumer_type: object, options: Mapping[str, Any]
) -> None:
    """Refuse arguments the wrapper cannot honour (each error names the argument and the fix)."""
    import pulsar

    if dead_letter is not None and not isinstance(dead_letter, DeadLetterPolicy):
        raise ConfigurationError(
            "dead_letter_policy must be a pulsar_dlq_consumer.DeadLetterPolicy (same arguments as "
            f"pulsar.ConsumerDeadLetterPolicy) or None; got {dead_letter!r}"
        )
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise ConfigurationError(f"retry_policy must be a RetryPolicy or None; got {retry!r}")
    if not callable(getattr(backoff, "next", None)):
        raise ConfigurationError(f"backoff must have a next(redelivery_count) method; got {backoff!r}")
    if consumer_type not in (pulsar.ConsumerType.Shared, pulsar.ConsumerType.KeyShared):
        raise UnsupportedSubscriptionTypeError(
            f"consumer_type must be ConsumerType.Shared or ConsumerType.KeyShared: retry topics, "
            f"nack backoff and dead-lettering need individual acks; got {consumer_type!r}"
        )
    if managed := options.keys() & _MANAGED_OPTIONS:
        raise ConfigurationError(
            f"{sorted(managed)} are managed by DlqConsumer: use consumer_type=, consumer_name=, backoff= "
            "instead (message listeners are not supported; call receive())"
        )


def _reconsume_times(msg: pulsar.Message) -> int:
    """``RECONSUMETIMES`` of ``msg``, read as the context parser reads it (untrusted: junk counts as 0)."""
    return read_int(msg.properties(), RECONSUMETIMES) or 0
