"""The proxy's telemetry recorder: events about connections, record batches and admin
decisions, built from what the paths know (a `ClientInfo`, filter stats) and handed to the sink.

The paths and the connection glue call the recorder; the event builders (`events.py`) and the
sinks (`sinks.py`) stay independent of the proxy. The recorder runs on the event loop; it never
raises into client traffic (a failing builder is logged and the event is lost, counted).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, cast

from sluice.codec.messages import ApiKey
from sluice.filters.chain import FilterStats
from sluice.proxy.contract import ClientInfo
from sluice.proxy.telemetry import events
from sluice.proxy.telemetry.logs import log
from sluice.proxy.telemetry.metrics import Metrics
from sluice.proxy.telemetry.sinks import NullSink, TelemetrySink


class TelemetryRecorder:
    def __init__(self, proxy: events.ProxyInfo, metrics: Metrics) -> None:
        self.proxy = proxy
        self.metrics = metrics
        self.sink: TelemetrySink = NullSink()
        self.failed = 0

    def connection_id(self, client: ClientInfo) -> str:
        return f"{self.proxy.instance_id}-{client.id}"

    def _emit(self, build: Any, **fields: Any) -> None:
        if type(self.sink) is NullSink:
            self.sink.discard()  # telemetry off: nobody reads the event, so none is built
            return
        try:
            self.sink.emit(build(self.proxy, **fields))
        except Exception as exc:  # telemetry must never break client traffic
            self.failed += 1
            log.error("telemetry_event_failed", error=repr(exc))

    # ------------------------------------------------------------------ record batches
    def stats_only(self, stats: Sequence[FilterStats]) -> bool:
        """With telemetry off, count one filtered partition's `stats` in the metrics, as
        `record_batch` does, and return True: the caller then builds no event. False when
        telemetry is on (the caller calls `record_batch`)."""
        sink = self.sink
        if type(sink) is not NullSink:
            return False
        self.metrics.filter_stats(stats)
        sink.discard()
        return True

    def record_batch(
        self,
        client: ClientInfo,
        *,
        api: str,
        topic: str,
        partition: int,
        offset_first: int | None,
        offset_last: int | None,
        records_in: int,
        records_out: int,
        bytes_in: int,
        bytes_out: int,
        stats: Sequence[FilterStats],
        error_code: int = 0,
        error_message: str | None = None,
        record_errors: Sequence[tuple[int, str]] = (),
        dead_letters: int = 0,
    ) -> None:
        """One topic-partition of a Produce request or Fetch response that filters saw."""
        self.metrics.filter_stats(list(stats))
        if type(self.sink) is NullSink:
            # Telemetry off: the metrics above are all that is kept. Building the event costs
            # ~10 µs, a tenth of the proxy's CPU for a one-record filtered Produce (issue 29).
            self.sink.discard()
            return
        self._emit(
            events.record_batch_event,
            connection_id=self.connection_id(client),
            client_address=client.client_address,
            client_id=client.client_id,
            principal=client.principal,
            api=api,
            topic=topic,
            partition=partition,
            offset_first=offset_first,
            offset_last=offset_last,
            records_in=records_in,
            records_out=records_out,
            bytes_in=bytes_in,
            bytes_out=bytes_out,
            filters=events.filter_entries(cast(Any, stats)),
            error_code=error_code,
            error_message=error_message,
            reject_reasons=events.reject_reason_counts(record_errors),
            dead_letters=dead_letters,
        )

    # ------------------------------------------------------------------ admin
    def admin_decision(self, client: ClientInfo, **fields: Any) -> None:
        self._emit(
            events.admin_event,
            connection_id=self.connection_id(client),
            client_address=client.client_address,
            client_id=client.client_id,
            principal=client.principal,
            **fields,
        )

    def filter_loaded(self, **fields: Any) -> None:
        self._emit(events.filter_loaded_event, **fields)

    # ------------------------------------------------------------------ connections
    def connection_opened(self, client: ClientInfo) -> None:
        if type(self.sink) is NullSink:
            # Telemetry off: no event, nor its fields (every client connection comes here).
            self.sink.discard()
            return
        self._emit(
            events.connection_event,
            phase="open",
            connection_id=self.connection_id(client),
            client_address=client.client_address,
            upstream="{}:{}".format(*client.upstream_address),
        )

    def connection_closed(self, client: ClientInfo) -> None:
        if type(self.sink) is NullSink:
            # Telemetry off: the per-API counts were named through the ApiKey enum (on
            # every client connection's close) for an event nobody builds (issue 29).
            self.sink.discard()
            return
        apis = {}
        for key, count in client.stats.requests.items():
            try:
                name = ApiKey(key).name.lower()
            except ValueError:
                name = f"api_{key}"
            apis[name] = {"requests": count}
        self._emit(
            events.connection_event,
            phase="close",
            connection_id=self.connection_id(client),
            client_address=client.client_address,
            client_id=client.client_id,
            principal=client.principal,
            upstream="{}:{}".format(*client.upstream_address),
            bytes_in=client.stats.bytes_in,
            bytes_out=client.stats.bytes_out,
            apis=apis,
            duration_ms=int((time.time() - client.opened) * 1000),
            throttle_ms=client.stats.throttle_ms,
        )
