"""Telemetry sinks: where events go, written off the event loop.

``emit`` only appends to a bounded in-memory queue (a few hundred nanoseconds, no lock
contention with IO, never blocks); one background thread per sink serialises the events
and writes them. When the queue is full, or the backend fails, events are dropped, and
every drop is counted, logged (rate-limited) and exposed through ``stats()``; once the
backend works again the sink writes a ``telemetry_dropped`` event so the gap also shows
in the data the audit reads.

Backends here: JSON Lines files rotated by size and age (``FileSink``) and JSON messages on a
Kafka topic (``KafkaSink``, confluent-kafka / librdkafka). The columnar sinks (Parquet files,
Arrow IPC on Kafka) build on ``QueuedSink`` in their own modules; ``telemetry_factory.make_sink``
builds the one the proxy config's ``telemetry:`` section asks for, validated here by
``parse_telemetry_config``.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import structlog

from sluice.proxy.telemetry.events import ProxyInfo, now_ms, telemetry_dropped_event
from sluice.telemetry_schema.integrity import (
    KAFKA_JSON,
    TAG_HEADER,
    FileMac,
    Tagger,
    TelemetryKeyError,
    load_key,
    write_sidecar,
)

log = structlog.get_logger("sluice.telemetry")

DEFAULT_QUEUE_SIZE = 100_000
DEFAULT_ROTATE_BYTES = 64 * 1024 * 1024
DEFAULT_ROTATE_SECONDS = 300.0
# How long the writer thread sleeps when the queue is empty: bounds the delay before an
# event reaches the file without waking the loop thread on every emit.
POLL_SECONDS = 0.05
LOG_EVERY_SECONDS = 10.0


class TelemetryConfigError(ValueError):
    """The ``telemetry:`` section of the config is invalid; the message names the field."""


@runtime_checkable
class TelemetrySink(Protocol):
    def emit(self, event: dict[str, Any]) -> None:
        """Queue one event; never blocks, never raises."""

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued (up to ``timeout`` seconds), then release the backend."""

    def stats(self) -> dict[str, Any]:
        """Counters: emitted, written, dropped (and why), errors, queued."""


def _dumps(event: Mapping[str, Any]) -> str:
    return json.dumps(event, separators=(",", ":"), default=str)


class PartialWriteError(Exception):
    """A backend failed part-way through a batch after writing ``written`` of its events."""

    def __init__(self, written: int, cause: BaseException, gap_written: bool = False) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.written = written
        self.gap_written = gap_written


class _RateLimitedLog:
    """Logs a warning at most once per interval, with the number of suppressed repeats."""

    def __init__(self, interval: float = LOG_EVERY_SECONDS) -> None:
        self._interval = interval
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._lock = threading.Lock()

    def warning(self, key: str, message: str, **fields: Any) -> None:
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self._interval:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return
            self._last[key] = now
            suppressed = self._suppressed.pop(key, 0)
        log.warning(message, suppressed_since_last=suppressed, **fields)


class NullSink:
    """Telemetry switched off: counts what it is given and keeps nothing."""

    def __init__(self) -> None:
        self._emitted = 0
        self._lock = threading.Lock()

    def emit(self, event: dict[str, Any]) -> None:
        self.discard()

    def discard(self) -> None:
        """Count an event that was never built (the recorder skips building for this sink)."""
        with self._lock:
            self._emitted += 1

    def close(self, timeout: float = 5.0) -> None:
        return None

    def stats(self) -> dict[str, Any]:
        return {
            "sink": "null",
            "emitted": self._emitted,
            "written": 0,
            "dropped": 0,
            "dropped_queue_full": 0,
            "dropped_sink_error": 0,
            "discarded": self._emitted,
            "errors": 0,
            "queued": 0,
            "in_flight": 0,
            "last_error": None,
        }


class QueuedSink:
    """Bounded queue + writer thread; subclasses implement the backend hooks.

    Invariant (after ``close``): ``emitted == written + dropped``; while running the
    difference is ``queued + in_flight``.
    """

    kind = "queued"

    def __init__(self, proxy: ProxyInfo, queue_size: int = DEFAULT_QUEUE_SIZE) -> None:
        if queue_size < 1:
            raise TelemetryConfigError("telemetry.queue_size: must be >= 1")
        self._proxy = proxy
        self._queue: deque[dict[str, Any]] = deque()
        self._queue_size = queue_size
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._emitted = 0
        self._written = 0
        self._dropped_full = 0
        self._dropped_error = 0
        self._errors = 0
        self._last_error: str | None = None
        # Drops already announced with a telemetry_dropped event, and since when.
        self._reported_dropped = 0
        self._drop_window_start_ms = now_ms()
        self._rlog = _RateLimitedLog()
        self._thread = threading.Thread(
            target=self._run, name=f"sluice-telemetry-{self.kind}", daemon=True
        )
        self._thread.start()

    # -- producer side (event loop) -------------------------------------------------------

    def emit(self, event: dict[str, Any]) -> None:
        with self._lock:
            self._emitted += 1
            if self._stopping or len(self._queue) >= self._queue_size:
                self._dropped_full += 1
                full = True
            else:
                self._queue.append(event)
                full = False
        if full:
            self._rlog.warning(
                "queue_full",
                "telemetry queue full, dropping events",
                sink=self.kind,
                queue_size=self._queue_size,
                dropped_total=self._dropped_full + self._dropped_error,
            )

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "sink": self.kind,
                "emitted": self._emitted,
                "written": self._written,
                "dropped": self._dropped_full + self._dropped_error,
                "dropped_queue_full": self._dropped_full,
                "dropped_sink_error": self._dropped_error,
                "errors": self._errors,
                "queued": len(self._queue),
                "in_flight": self._in_flight(),
                "last_error": self._last_error,
            }

    def close(self, timeout: float = 5.0) -> None:
        with self._lock:
            self._stopping = True
        self._wake.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            # The writer is stuck in its backend; whatever is still queued is lost.
            with self._lock:
                left = len(self._queue)
                self._queue.clear()
                self._dropped_error += left
                self._last_error = "close timed out"
            if left:
                log.warning("telemetry sink close timed out", sink=self.kind, dropped=left)

    # -- writer thread --------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._open_backend()
        except Exception as exc:
            self._record_error(exc)
        while True:
            batch = self._take_batch()
            if batch:
                self._write_guarded(batch)
            else:
                with self._lock:
                    stopping = self._stopping
                if stopping:
                    break
                self._wake.wait(POLL_SECONDS)
                self._wake.clear()
            try:
                self._tick()
            except Exception as exc:
                self._record_error(exc)
        try:
            self._close_backend()
        except Exception as exc:
            self._record_error(exc)

    def _take_batch(self, limit: int = 5000) -> list[dict[str, Any]]:
        batch: list[dict[str, Any]] = []
        queue = self._queue
        with self._lock:
            n = min(limit, len(queue))
            for _ in range(n):
                batch.append(queue.popleft())
        return batch

    def _write_guarded(self, batch: list[dict[str, Any]]) -> None:
        with self._lock:
            unreported = self._dropped_full + self._dropped_error - self._reported_dropped
        gap: dict[str, Any] | None = None
        if unreported > 0:
            until = now_ms()
            gap = telemetry_dropped_event(
                self._proxy,
                dropped=unreported,
                reason=self._last_error or "queue full",
                since_ms=self._drop_window_start_ms,
                until_ms=until,
            )
        try:
            written_now = self._write_batch(batch, gap)
        except Exception as exc:
            written_now = exc.written if isinstance(exc, PartialWriteError) else 0
            lost = len(batch) - written_now
            with self._lock:
                self._written += written_now
                self._dropped_error += lost
                if gap is not None and getattr(exc, "gap_written", False):
                    self._reported_dropped += unreported
                    self._drop_window_start_ms = gap["until_ms"]
            self._record_error(exc, dropped=lost)
            self._backoff()
            return
        with self._lock:
            self._written += written_now
            if gap is not None:
                self._reported_dropped += unreported
                self._drop_window_start_ms = gap["until_ms"]

    def _record_error(self, exc: BaseException, dropped: int = 0) -> None:
        message = f"{type(exc).__name__}: {exc}"
        with self._lock:
            self._errors += 1
            self._last_error = message
        self._rlog.warning(
            "sink_error", "telemetry sink error", sink=self.kind, error=message, dropped=dropped
        )

    def _backoff(self) -> None:
        # Keeps a dead backend from spinning the CPU; emit() is unaffected (the queue
        # absorbs, then drops and counts).
        with self._lock:
            stopping = self._stopping
        if not stopping:
            self._wake.wait(0.5)

    def _count_written(self, n: int) -> None:
        with self._lock:
            self._written += n

    def _count_dropped_error(self, n: int, message: str) -> None:
        with self._lock:
            self._dropped_error += n
            self._errors += 1
            self._last_error = message
        self._rlog.warning("sink_error", "telemetry sink error", sink=self.kind, error=message)

    # -- backend hooks --------------------------------------------------------------------

    def _open_backend(self) -> None:
        return None

    def _write_batch(self, batch: list[dict[str, Any]], gap: dict[str, Any] | None) -> int:
        """Write ``gap`` (if any) then ``batch``; return events of ``batch`` written now.

        Raise to have the whole batch counted as dropped. Asynchronous backends return 0
        and count deliveries themselves with ``_count_written`` / ``_count_dropped_error``.
        """
        raise NotImplementedError

    def _tick(self) -> None:
        return None

    def _close_backend(self) -> None:
        return None

    def _in_flight(self) -> int:
        return 0


def check_rotation(rotate_bytes: int, rotate_seconds: float) -> None:
    """The rotation limits every file sink takes; raises naming the field."""
    if rotate_bytes < 1:
        raise TelemetryConfigError("telemetry.rotate_bytes: must be >= 1")
    if rotate_seconds <= 0:
        raise TelemetryConfigError("telemetry.rotate_seconds: must be > 0")


class FileSink(QueuedSink):
    """JSON Lines files, one event per line, rotated by size and by age.

    The open file is ``<name>.jsonl.tmp``; rotation closes it (fsync) and renames it to
    ``<name>.jsonl``, so a reader that takes only ``*.jsonl`` never sees a half-written file.
    Names: ``sluice-telemetry-<instance_id>-<seq:06d>-<UTC start time>.jsonl``.
    """

    kind = "file"

    def __init__(
        self,
        proxy: ProxyInfo,
        directory: str | os.PathLike[str],
        *,
        rotate_bytes: int = DEFAULT_ROTATE_BYTES,
        rotate_seconds: float = DEFAULT_ROTATE_SECONDS,
        queue_size: int = DEFAULT_QUEUE_SIZE,
        fsync: bool = True,
        tagger: Tagger | None = None,
    ) -> None:
        check_rotation(rotate_bytes, rotate_seconds)
        self.directory = Path(directory)
        self.rotate_bytes = rotate_bytes
        self.rotate_seconds = rotate_seconds
        self._fsync = fsync
        # Tags each published file (a sidecar ``<name>.jsonl.tag``), computed as it is written.
        self._tagger = tagger
        self._mac: FileMac | None = None
        self._seq = 0
        self._file: Any = None
        self._tmp_path: Path | None = None
        self._final_path: Path | None = None
        self._file_bytes = 0
        self._opened_at = 0.0
        self.completed_files: list[Path] = []
        super().__init__(proxy, queue_size)

    def _open_backend(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)

    def _new_file(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        while True:
            self._seq += 1
            stamp = datetime.now(tz=UTC).strftime("%Y%m%dT%H%M%S%fZ")
            base = f"sluice-telemetry-{self._proxy.instance_id}-{self._seq:06d}-{stamp}"
            final = self.directory / f"{base}.jsonl"
            tmp = self.directory / f"{base}.jsonl.tmp"
            if not final.exists() and not tmp.exists():
                break
        # "x": never append to or clobber a file another process might own.
        self._file = open(tmp, "x", encoding="utf-8")
        self._tmp_path, self._final_path = tmp, final
        self._mac = self._tagger.file_mac(final.name) if self._tagger is not None else None
        self._file_bytes = 0
        self._opened_at = time.monotonic()

    def _write_batch(self, batch: list[dict[str, Any]], gap: dict[str, Any] | None) -> int:
        done = 0
        gap_written = False
        try:
            if gap is not None:
                self._write_lines([_dumps(gap)])
                gap_written = True
            chunk: list[str] = []
            chunk_bytes = 0
            for event in batch:
                line = _dumps(event)
                chunk.append(line)
                chunk_bytes += len(line) + 1
                if self._file_bytes + chunk_bytes >= self.rotate_bytes:
                    self._write_lines(chunk)
                    done += len(chunk)
                    chunk, chunk_bytes = [], 0
                    self._rotate()
            if chunk:
                self._write_lines(chunk)
                done += len(chunk)
        except Exception as exc:
            raise PartialWriteError(done, exc, gap_written) from exc
        return done

    def _write_lines(self, lines: list[str]) -> None:
        if self._file is None:
            self._new_file()
        data = "\n".join(lines) + "\n"
        try:
            self._file.write(data)
            self._file.flush()
        except Exception:
            self._abandon_file()
            raise
        if self._mac is not None:
            self._mac.update(data.encode("ascii"))
        # ASCII-only JSON (ensure_ascii): characters == bytes.
        self._file_bytes += len(data)

    def _tick(self) -> None:
        if self._file is not None and time.monotonic() - self._opened_at >= self.rotate_seconds:
            self._rotate()

    def _rotate(self) -> None:
        f, tmp, final = self._file, self._tmp_path, self._final_path
        self._file = None
        if f is None or tmp is None or final is None:
            return
        f.flush()
        if self._fsync:
            os.fsync(f.fileno())
        f.close()
        if self._mac is not None:
            # The tag first: a reader never sees the published file without it.
            write_sidecar(final, self._mac.tag(), fsync=self._fsync)
            self._mac = None
        os.replace(tmp, final)
        self.completed_files.append(final)

    def _abandon_file(self) -> None:
        # After a write error keep what reached the disk (whole lines up to the failure are
        # valid JSON Lines; the reader drops a torn last line) and start a new file later.
        # It gets no tag (what reached the disk is not known): an audit that verifies counts
        # it as untagged.
        f, tmp, final = self._file, self._tmp_path, self._final_path
        self._file = None
        self._mac = None
        if f is not None:
            with contextlib.suppress(Exception):
                f.close()
        if tmp is not None and final is not None:
            with contextlib.suppress(Exception):
                os.replace(tmp, final)

    def _close_backend(self) -> None:
        self._rotate()


class KafkaSink(QueuedSink):
    """Produces each event as one JSON message to a Kafka topic (confluent-kafka).

    Key = proxy instance id, so one instance's events stay ordered within a partition.
    Delivery is at least once; events carry ``event_id`` for de-duplication.
    Point ``bootstrap`` at the brokers directly, not at the proxy, so the telemetry
    traffic does not produce telemetry about itself.
    """

    kind = "kafka"

    def __init__(
        self,
        proxy: ProxyInfo,
        bootstrap: str,
        topic: str,
        *,
        queue_size: int = DEFAULT_QUEUE_SIZE,
        producer_config: Mapping[str, Any] | None = None,
        create_partitions: int | None = None,
        message_timeout_ms: int = 30_000,
        tagger: Tagger | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        # Tags every message (header ``sluice-tag``) when the telemetry has a key.
        self._tagger = tagger
        self._create_partitions = create_partitions
        conf: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "client.id": f"sluice-telemetry-{proxy.instance_id}",
            "linger.ms": 50,
            "batch.num.messages": 10_000,
            "compression.type": "lz4",
            "acks": "all",
            "message.timeout.ms": message_timeout_ms,
            "queue.buffering.max.messages": 100_000,
            "error_cb": self._on_client_error,
            # librdkafka logs every failed connect to stderr; error_cb already reports them
            # through structlog, rate-limited.
            "log_level": 2,
        }
        conf.update(producer_config or {})
        self._conf = conf
        self._producer: Any = None
        # Events of ours handed to librdkafka whose delivery report has not come back.
        self._pending = 0
        self._close_deadline: float | None = None
        super().__init__(proxy, queue_size)

    def _on_client_error(self, err: Any) -> None:
        self._rlog.warning("kafka_client", "telemetry kafka client error", error=str(err))

    def _on_delivery(self, err: Any, _msg: Any) -> None:
        with self._lock:
            self._pending -= 1
        if err is None:
            self._count_written(1)
        else:
            self._count_dropped_error(1, f"kafka delivery failed: {err}")

    def _open_backend(self) -> None:
        from confluent_kafka import Producer

        self._producer = Producer(self._conf)
        if self._create_partitions:
            self._ensure_topic(self._create_partitions)

    def _ensure_topic(self, partitions: int) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        # The producer's connection settings (TLS, SASL), not its producing ones.
        admin_conf: dict[str, Any] = {
            k: v for k, v in self._conf.items()
            if k == "bootstrap.servers" or k.startswith(("security.", "ssl.", "sasl."))
        }
        admin_conf["log_level"] = 0
        admin = AdminClient(admin_conf)
        futures = admin.create_topics([NewTopic(self.topic, partitions)], request_timeout=10)
        for fut in futures.values():
            try:
                fut.result(timeout=15)
            except Exception as exc:
                # TOPIC_ALREADY_EXISTS is the normal case after the first start.
                if "TOPIC_ALREADY_EXISTS" not in str(exc) and "already exists" not in str(exc):
                    raise

    def _write_batch(self, batch: list[dict[str, Any]], gap: dict[str, Any] | None) -> int:
        producer = self._producer
        if producer is None:
            raise RuntimeError("kafka producer not started")
        key = self._proxy.instance_id.encode()
        if gap is not None:
            value = _dumps(gap).encode()
            self._produce(producer, value, key, self._on_gap_delivery, self._json_tag(key, value))
        for i, event in enumerate(batch):
            try:
                with self._lock:
                    self._pending += 1
                value = _dumps(event).encode()
                self._produce(producer, value, key, self._on_delivery,
                              self._json_tag(key, value))
            except Exception as exc:
                with self._lock:
                    self._pending -= 1
                self._count_dropped_error(len(batch) - i, f"kafka produce failed: {exc}")
                break
        producer.poll(0)
        return 0

    def _json_tag(self, key: bytes, value: bytes) -> list[tuple[str, bytes]] | None:
        if self._tagger is None:
            return None
        return [(TAG_HEADER, self._tagger.tag(KAFKA_JSON, [key], value))]

    def _produce(
        self,
        producer: Any,
        value: bytes,
        key: bytes,
        callback: Any,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        while True:
            try:
                producer.produce(self.topic, value, key, on_delivery=callback, headers=headers)
                return
            except BufferError:
                # librdkafka's own queue is full: wait here (we are off the event loop);
                # meanwhile emit() keeps queueing and, when full, drops and counts.
                producer.poll(0.1)

    def _on_gap_delivery(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self._rlog.warning("gap_delivery", "telemetry gap event not delivered", error=str(err))

    def _tick(self) -> None:
        if self._producer is not None:
            self._producer.poll(0)

    def _in_flight(self) -> int:
        # Called with self._lock held.
        return self._pending

    def close(self, timeout: float = 5.0) -> None:
        self._close_deadline = time.monotonic() + timeout
        super().close(timeout)

    def _close_backend(self) -> None:
        producer = self._producer
        if producer is None:
            return
        deadline = self._close_deadline or time.monotonic() + 5.0
        # Leave a little of close()'s time for the bookkeeping after flush.
        producer.flush(max(0.1, deadline - time.monotonic() - 0.2))
        with self._lock:
            lost, self._pending = self._pending, 0
        if lost:
            self._count_dropped_error(lost, "kafka delivery unconfirmed at close")


class TeeSink:
    """Sends every event to several sinks (e.g. files and a Kafka topic)."""

    def __init__(self, sinks: list[TelemetrySink]) -> None:
        self.sinks = sinks

    def emit(self, event: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.emit(event)

    def close(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        for sink in self.sinks:
            sink.close(max(0.0, deadline - time.monotonic()))

    def stats(self) -> dict[str, Any]:
        parts = [s.stats() for s in self.sinks]
        total: dict[str, Any] = {"sink": "tee", "sinks": parts}
        for key in ("emitted", "written", "dropped", "errors", "queued", "in_flight"):
            total[key] = sum(int(p.get(key, 0)) for p in parts)
        return total


_FILE_KEYS = {
    "dir", "format", "flush_seconds", "rotate_bytes", "rotate_seconds", "queue_size", "fsync",
    "kafka", "enabled", "key_file",
}
_KAFKA_KEYS = {"bootstrap", "topic", "format", "config", "create_partitions", "message_timeout_ms"}
FILE_FORMATS = ("parquet", "jsonl")
KAFKA_FORMATS = ("arrow", "json")
DEFAULT_FLUSH_SECONDS = 1.0


def _get(
    cfg: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str, default: Any
) -> Any:
    value = cfg.get(key, default)
    if value is default:
        return value
    if isinstance(value, bool) and kind is not bool and bool not in _as_tuple(kind):
        raise TelemetryConfigError(f"{where}.{key}: expected {kind}, got a boolean")
    if not isinstance(value, kind):
        raise TelemetryConfigError(f"{where}.{key}: expected {kind}, got {type(value).__name__}")
    return value


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


@dataclass(frozen=True, slots=True)
class TelemetrySettings:
    """The validated ``telemetry:`` section (see docs/TELEMETRY.md for each key)."""

    enabled: bool
    queue_size: int
    directory: str | os.PathLike[str] | None
    rotate_bytes: int
    rotate_seconds: float
    fsync: bool
    kafka_bootstrap: str | None
    kafka_topic: str | None
    kafka_config: dict[str, Any] | None
    create_partitions: int | None
    message_timeout_ms: int
    file_format: str = "parquet"
    kafka_format: str = "arrow"
    flush_seconds: float = DEFAULT_FLUSH_SECONDS
    # The telemetry key's file (docs/TELEMETRY.md, "Authenticated telemetry"); None: untagged.
    key_file: str | None = None

    def tagger(self) -> Tagger | None:
        """The tagger of ``key_file`` (read now), None without one; raises
        ``TelemetryConfigError`` naming the field when the file is not a key."""
        if self.key_file is None:
            return None
        try:
            return Tagger(load_key(self.key_file))
        except TelemetryKeyError as exc:
            raise TelemetryConfigError(f"telemetry.key_file: {exc}") from None

    def describe(self) -> str:
        """One line for `sluice config check` and start-up logs."""
        if not self.enabled:
            return "off (enabled: false)"
        parts = []
        if self.directory is not None:
            what = (
                f"Parquet datasets in {self.directory} (flush every {self.flush_seconds:g} s, "
                if self.file_format == "parquet"
                else f"JSON Lines files in {self.directory} ("
            )
            parts.append(
                f"{what}rotate at {self.rotate_bytes} bytes or "
                f"{self.rotate_seconds:g} s, fsync {'on' if self.fsync else 'off'})"
            )
        if self.kafka_topic is not None:
            parts.append(
                f"Kafka topic {self.kafka_topic} at {self.kafka_bootstrap} "
                f"({'Arrow IPC batches' if self.kafka_format == 'arrow' else 'JSON messages'})"
            )
        if not parts:
            return "off (no dir or kafka configured)"
        signed = (f"tagged with the key in {self.key_file}" if self.key_file
                  else "NOT tagged (no key_file: the audit cannot tell it from forged rows)")
        return " and ".join(parts) + f", queue {self.queue_size} events, {signed}"


def parse_telemetry_config(telemetry_config: Mapping[str, Any] | None) -> TelemetrySettings:
    """Validate the ``telemetry:`` section without opening files or connections.

    Raises ``TelemetryConfigError`` naming the offending field.
    """
    cfg = dict(telemetry_config or {})
    unknown = set(cfg) - _FILE_KEYS
    if unknown:
        raise TelemetryConfigError(f"telemetry.{sorted(unknown)[0]}: unknown key")
    bootstrap = topic = None
    producer_config = create_partitions = None
    message_timeout_ms = 30_000
    kafka_format = "arrow"
    kafka = _get(cfg, "kafka", dict, "telemetry", None)
    if kafka is not None:
        unknown = set(kafka) - _KAFKA_KEYS
        if unknown:
            raise TelemetryConfigError(f"telemetry.kafka.{sorted(unknown)[0]}: unknown key")
        bootstrap = _get(kafka, "bootstrap", str, "telemetry.kafka", None)
        topic = _get(kafka, "topic", str, "telemetry.kafka", None)
        if not bootstrap:
            raise TelemetryConfigError("telemetry.kafka.bootstrap: required (HOST:PORT)")
        if not topic:
            raise TelemetryConfigError("telemetry.kafka.topic: required")
        producer_config = _get(kafka, "config", dict, "telemetry.kafka", None)
        create_partitions = _get(kafka, "create_partitions", int, "telemetry.kafka", None)
        message_timeout_ms = int(_get(kafka, "message_timeout_ms", int, "telemetry.kafka", 30_000))
        kafka_format = _get(kafka, "format", str, "telemetry.kafka", "arrow")
        if kafka_format not in KAFKA_FORMATS:
            raise TelemetryConfigError(
                f"telemetry.kafka.format: expected one of {', '.join(KAFKA_FORMATS)}"
            )
    file_format = _get(cfg, "format", str, "telemetry", "parquet")
    if file_format not in FILE_FORMATS:
        raise TelemetryConfigError(f"telemetry.format: expected one of {', '.join(FILE_FORMATS)}")
    flush_seconds = float(
        _get(cfg, "flush_seconds", (int, float), "telemetry", DEFAULT_FLUSH_SECONDS)
    )
    key_file = _get(cfg, "key_file", (str, os.PathLike), "telemetry", None)
    if key_file is not None and not str(key_file):
        raise TelemetryConfigError("telemetry.key_file: must name a file")
    if flush_seconds <= 0:
        raise TelemetryConfigError("telemetry.flush_seconds: must be > 0")
    return TelemetrySettings(
        enabled=_get(cfg, "enabled", bool, "telemetry", True) is not False,
        queue_size=int(_get(cfg, "queue_size", int, "telemetry", DEFAULT_QUEUE_SIZE)),
        directory=_get(cfg, "dir", (str, os.PathLike), "telemetry", None),
        rotate_bytes=int(_get(cfg, "rotate_bytes", int, "telemetry", DEFAULT_ROTATE_BYTES)),
        rotate_seconds=float(
            _get(cfg, "rotate_seconds", (int, float), "telemetry", DEFAULT_ROTATE_SECONDS)
        ),
        fsync=bool(_get(cfg, "fsync", bool, "telemetry", True)),
        kafka_bootstrap=bootstrap,
        kafka_topic=topic,
        kafka_config=producer_config,
        create_partitions=create_partitions,
        message_timeout_ms=message_timeout_ms,
        file_format=file_format,
        kafka_format=kafka_format,
        flush_seconds=flush_seconds,
        key_file=None if key_file is None else str(key_file),
    )
