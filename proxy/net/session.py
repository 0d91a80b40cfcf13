"""One client connection: frames in both directions, request/response correlation, ordering.

A session owns one upstream connection to the broker the client meant to reach. Requests are
handled strictly in arrival order; every request that expects a response gets a slot in
``_inflight`` and responses are written to the client in slot order, whether they come from the
broker (matched by correlation id) or are answered by the proxy itself. Frames that nothing
needs to change are forwarded as their original bytes.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import struct
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sluice.codec.errors import CodecError, FrameTooLarge
from sluice.codec.frames import FrameBuffer
from sluice.codec.headers import RequestHeader, parse_request_header, read_correlation_id
from sluice.proxy.telemetry.logs import log

if TYPE_CHECKING:
    from sluice.proxy.net.server import ProxyServer

_SIZE = struct.Struct(">i")
_READ_CHUNK = 256 * 1024
_HIGH_WATER = 4 * 1024 * 1024
_session_ids = itertools.count(1)

ResponseHook = Callable[["Session", "Pending", memoryview | bytes], Any]


class ProtocolViolation(Exception):
    """The peer sent something the proxy cannot safely relay; the connection is closed."""


@dataclass(slots=True)
class Pending:
    """A request that awaits its response, in client order."""

    header: RequestHeader
    from_upstream: bool
    on_response: ResponseHook | None = None
    state: Any = None
    response: bytes | memoryview | None = None
    started: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class ConnectionStats:
    bytes_in: int = 0
    bytes_out: int = 0
    requests: dict[int, int] = field(default_factory=dict)


class Session:
    def __init__(
        self,
        server: ProxyServer,
        client_reader: asyncio.StreamReader,
        client_writer: asyncio.StreamWriter,
        upstream: tuple[str, int],
        node_id: int | None,
    ) -> None:
        self.server = server
        self.id = next(_session_ids)
        self.node_id = node_id
        self.upstream_address = upstream
        self._cr = client_reader
        self._cw = client_writer
        self._ur: asyncio.StreamReader | None = None
        self._uw: asyncio.StreamWriter | None = None
        peer = client_writer.get_extra_info("peername")
        self.client_address = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.client_id: str | None = None
        self.principal: str | None = None
        self.sasl: Any = None  # sluice.proxy.paths.sasl.SaslState once SASL starts
        self.stats = ConnectionStats()
        self.opened = time.time()
        self._inflight: deque[Pending] = deque()
        self._awaiting: deque[Pending] = deque()
        # Correlation ids of requests sent without expecting a response (acks=0 Produce).
        self._unanswered: deque[int] = deque(maxlen=256)
        self.log = log.bind(conn=self.id, client=self.client_address, node=node_id)

    # ---------------------------------------------------------------- lifecycle
    async def run(self) -> None:
        host, port = self.upstream_address
        try:
            self._ur, self._uw = await asyncio.open_connection(
                host, port, limit=_READ_CHUNK, **self.server.upstream_tls_args(host)
            )
        except OSError as exc:
            self.log.warning("upstream_connect_failed", upstream=f"{host}:{port}", error=str(exc))
            await self._close_client()
            return
        self.server.session_opened(self)
        to_upstream = asyncio.create_task(self._pump_requests())
        to_client = asyncio.create_task(self._pump_responses())
        try:
            done, _ = await asyncio.wait(
                {to_upstream, to_client}, return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                failure = task.exception()
                if isinstance(failure, ProtocolViolation):
                    self.server.metrics.protocol_violations += 1
                    self.log.warning("connection_closed_protocol_violation", reason=str(failure))
                elif failure is not None and not isinstance(
                    failure, ConnectionError | asyncio.CancelledError
                ):
                    self.log.error("connection_failed", error=repr(failure), exc_info=failure)
        finally:
            for task in (to_upstream, to_client):
                task.cancel()
            await asyncio.gather(to_upstream, to_client, return_exceptions=True)
            await self._close_upstream()
            await self._close_client()
            self.server.session_closed(self)

    async def _close_client(self) -> None:
        self._cw.close()
        try:
            await asyncio.wait_for(self._cw.wait_closed(), 2)
        except (OSError, TimeoutError, asyncio.CancelledError):
            pass

    async def _close_upstream(self) -> None:
        if self._uw is not None:
            self._uw.close()
            try:
                await asyncio.wait_for(self._uw.wait_closed(), 2)
            except (OSError, TimeoutError, asyncio.CancelledError):
                pass

    @property
    def busy(self) -> bool:
        """Requests are waiting for their responses."""
        return bool(self._inflight)

    def close(self, reason: str, **fields: Any) -> None:
        """Close the connection from the proxy's side (a limit, shutdown); `run` then ends."""
        self.log.info("connection_closed_by_proxy", reason=reason, **fields)
        self._cw.close()

    # ---------------------------------------------------------------- client -> broker
    async def _pump_requests(self) -> None:
        frames = FrameBuffer(self.server.config.max_frame_size)
        reader = self._cr
        uw = self._uw
        assert uw is not None
        transport = uw.transport
        while True:
            data = await reader.read(_READ_CHUNK)
            if not data:
                return
            self.stats.bytes_in += len(data)
            try:
                bodies = frames.feed(data)
            except FrameTooLarge as exc:
                raise ProtocolViolation(f"request frame too large: {exc}") from None
            for body in bodies:
                await self._on_request(body)
            if transport.get_write_buffer_size() > _HIGH_WATER:
                await uw.drain()

    async def _on_request(self, body: memoryview | bytes) -> None:
        if type(body) is memoryview and not body.readonly:
            body = body.toreadonly()
        try:
            header = parse_request_header(body)
        except CodecError as exc:
            raise ProtocolViolation(f"malformed request header: {exc}") from None
        if header.client_id is not None:
            self.client_id = header.client_id
        counts = self.stats.requests
        counts[header.api_key] = counts.get(header.api_key, 0) + 1
        self.server.metrics.request(header.api_key, header.api_version, len(body))
        handler = self.server.request_handler(header.api_key)
        if handler is None:
            self.forward(header, body)
            return
        result = handler(self, header, body)
        if inspect.isawaitable(result):
            await result

    def forward(
        self,
        header: RequestHeader,
        body: memoryview | bytes,
        on_response: ResponseHook | None = None,
        state: Any = None,
        expect_response: bool = True,
    ) -> None:
        """Send a request frame body upstream and reserve its response slot."""
        if expect_response:
            hook = on_response or self.server.response_hook(header.api_key, header.api_version)
            pending = Pending(header, True, hook, state)
            self._inflight.append(pending)
            self._awaiting.append(pending)
        else:
            self._unanswered.append(header.correlation_id)
        assert self._uw is not None
        self._uw.writelines((_SIZE.pack(len(body)), body))

    def answer(self, header: RequestHeader, response: bytes) -> None:
        """Answer a request from the proxy itself, in order with the broker's answers."""
        self._inflight.append(Pending(header, False, response=response))
        self._flush()

    # ---------------------------------------------------------------- broker -> client
    async def _pump_responses(self) -> None:
        assert self._ur is not None
        frames = FrameBuffer(self.server.config.max_frame_size)
        reader = self._ur
        transport = self._cw.transport
        while True:
            data = await reader.read(_READ_CHUNK)
            if not data:
                if self._inflight:
                    self.log.info("upstream_closed", unanswered=len(self._inflight))
                return
            try:
                bodies = frames.feed(data)
            except FrameTooLarge as exc:
                raise ProtocolViolation(f"response frame too large: {exc}") from None
            for body in bodies:
                await self._on_response(body)
            if self.server.has_unstarted_listeners():
                await self.server.start_pending_listeners()
            self._flush()
            if transport.get_write_buffer_size() > _HIGH_WATER:
                await self._cw.drain()

    async def _on_response(self, body: memoryview | bytes) -> None:
        if type(body) is memoryview and not body.readonly:
            # Frames reassembled across reads are views of a bytearray; kio's native decoder
            # only takes read-only buffers (toreadonly is zero-copy).
            body = body.toreadonly()
        try:
            correlation_id = read_correlation_id(body)
        except CodecError as exc:
            raise ProtocolViolation(f"malformed response: {exc}") from None
        awaiting = self._awaiting
        if (
            not awaiting or awaiting[0].header.correlation_id != correlation_id
        ) and correlation_id in self._unanswered:
            # Tansu 0.6 answers acks=0 Produce requests, which Kafka never does; clients
            # ignore such answers, so the proxy drops them instead of closing the connection.
            self._unanswered.remove(correlation_id)
            return
        if not awaiting:
            raise ProtocolViolation(f"unsolicited response, correlation id {correlation_id}")
        pending = self._awaiting.popleft()
        if pending.header.correlation_id != correlation_id:
            raise ProtocolViolation(
                f"response correlation id {correlation_id} does not match request "
                f"{pending.header.correlation_id}"
            )
        if pending.on_response is None:
            pending.response = body
        else:
            result = pending.on_response(self, pending, body)
            if inspect.isawaitable(result):
                result = await result
            pending.response = result
        hdr = pending.header
        self.server.metrics.response(
            hdr.api_key, hdr.api_version, len(body), time.monotonic() - pending.started
        )

    def _flush(self) -> None:
        inflight = self._inflight
        out: list[bytes | memoryview] = []
        while inflight and inflight[0].response is not None:
            response = inflight.popleft().response
            assert response is not None
            out.append(_SIZE.pack(len(response)))
            out.append(response)
        if out:
            self._cw.writelines(out)
            self.stats.bytes_out += sum(len(b) for b in out)
