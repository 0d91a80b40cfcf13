"""A minimal Kafka client the proxy uses for its own requests to the cluster.

Used for producing dead letters, for the topic-id look-ups of Produce and Fetch (a client's
request waits behind one, `paths/topics.py`) and for looking up current topic configs for
admin policy checks. `UpstreamDialer` opens connections the way the cluster wants them: TLS
when `upstream_tls:` is configured, then ApiVersions, then SASL (SaslHandshake v1 and
SaslAuthenticate) as the `upstream_sasl:` user when that section is configured. Callers decide
whether to keep a connection (the dead-letter writer reuses one per broker) or close it.
Credentials are never logged nor put into error messages.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
import struct
import time
from typing import TYPE_CHECKING, Any

from sluice.codec import entities, schemas
from sluice.codec.frames import FrameBuffer
from sluice.codec.headers import request_header_bytes, response_header_size
from sluice.codec.messages import (
    ApiKey,
    codec_version_range,
    decode_response,
    encode_request,
)
from sluice.proxy.contract import UpstreamError
from sluice.proxy.net.upstream_sasl import SaslClientError, UpstreamSasl

if TYPE_CHECKING:
    from sluice.proxy.net.tls import UpstreamTLS
    from sluice.proxy.ops.config import ProxyConfig

_SIZE = struct.Struct(">i")
_ids = itertools.count(1)
CLIENT_ID = "sluice-proxy"


class UpstreamAuthError(UpstreamError):
    """SASL with the broker failed (names the user and mechanism, never the password)."""


class UpstreamConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._frames = FrameBuffer()
        self._ready: list[Any] = []
        self.versions: dict[int, tuple[int, int]] = {}
        self.address: tuple[str, int] = ("", 0)  # as dialled (set by `open`)
        #: monotonic time after which the broker ends the SASL session (None: never).
        self.expires_at: float | None = None

    @classmethod
    async def open(
        cls, host: str, port: int, timeout: float = 10, **tls: Any
    ) -> UpstreamConnection:
        """Connect and negotiate versions; `tls` is UpstreamDialer.tls_args(host). No SASL:
        use `UpstreamDialer.connect` for a cluster that wants it."""
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, **tls), timeout)
        conn = cls(reader, writer)
        conn.address = (host, port)
        try:
            await conn._negotiate_versions(timeout)
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _negotiate_versions(self, timeout: float) -> None:
        resp = await self.request(
            ApiKey.API_VERSIONS,
            3,
            timeout,
            client_software_name="sluice",
            client_software_version="0.1.0",
        )
        if int(resp.error_code) != 0:
            raise UpstreamError(f"ApiVersions refused by the broker: error {int(resp.error_code)}")
        for entry in resp.api_keys:
            self.versions[int(entry.api_key)] = (int(entry.min_version), int(entry.max_version))

    @property
    def expired(self) -> bool:
        return self.expires_at is not None and time.monotonic() >= self.expires_at

    @property
    def closed(self) -> bool:
        return self._writer.is_closing()

    def pick_version(self, api_key: int, ceiling: int | None = None) -> int:
        ours = codec_version_range(api_key)
        theirs = self.versions.get(api_key)
        if ours is None or theirs is None:
            raise UpstreamError(f"{ApiKey(api_key).name} is not supported by the broker or codec")
        high = min(ours[1], theirs[1], ceiling if ceiling is not None else 1 << 15)
        if high < max(ours[0], theirs[0]):
            raise UpstreamError(f"no common version for {ApiKey(api_key).name}")
        return high

    async def request(
        self, api_key: int, version: int, timeout: float = 15, /, **fields: Any
    ) -> Any:
        # `timeout` (seconds to wait for the answer) is positional-only so that a request
        # field of the same name (Produce's `timeout`) can be passed in `fields`.
        cls = schemas.request_schema(api_key, version)
        body = encode_request(entities.build(cls, **fields))
        corr = next(_ids) & 0x7FFFFFFF
        frame = request_header_bytes(api_key, version, corr, CLIENT_ID) + body
        self._writer.write(_SIZE.pack(len(frame)) + frame)
        await self._writer.drain()
        while not self._ready:
            data = await asyncio.wait_for(self._reader.read(65536), timeout)
            if not data:
                raise UpstreamError("broker closed the connection")
            self._ready.extend(bytes(f) for f in self._frames.feed(data))
        raw = self._ready.pop(0)
        size = response_header_size(raw, api_key, version)
        return decode_response(api_key, version, raw[size:])

    async def close(self) -> None:
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except OSError:
            pass


class UpstreamDialer:
    """Opens connections to the cluster as `upstream_tls:` and `upstream_sasl:` say.

    ``connect()`` dials the bootstrap addresses (``--upstream``) in order until one answers;
    ``connect(host, port)`` dials one broker (an address learnt from Metadata). Each returned
    connection has negotiated API versions and, when configured, completed SASL."""

    def __init__(self, config: ProxyConfig, timeout: float = 10.0) -> None:
        self.bootstrap: list[tuple[str, int]] = list(config.upstream)
        self.tls: UpstreamTLS | None = config.upstream_tls
        self.sasl: UpstreamSasl | None = config.upstream_sasl
        self.timeout = timeout
        self._ssl: ssl.SSLContext | None = self.tls.context() if self.tls is not None else None

    def tls_args(self, host: str) -> dict[str, Any]:
        """Keyword arguments for `asyncio.open_connection` to a broker at `host`."""
        if self._ssl is None or self.tls is None:
            return {}
        return {"ssl": self._ssl, "server_hostname": self.tls.hostname_for(host)}

    async def connect(self, host: str | None = None, port: int | None = None) -> UpstreamConnection:
        if host is not None and port is not None:
            return await self._connect_one(host, port)
        if host is not None or port is not None:
            raise ValueError("give both host and port, or neither (bootstrap)")
        last: Exception | None = None
        for address in self.bootstrap:
            try:
                return await self._connect_one(*address)
            except UpstreamAuthError:
                raise  # wrong credentials: another bootstrap broker will not accept them either
            except (TimeoutError, OSError, UpstreamError, ssl.SSLError) as exc:
                last = exc
        raise UpstreamError(f"no bootstrap broker reachable ({_describe(last)})")

    async def _connect_one(self, host: str, port: int) -> UpstreamConnection:
        conn = await UpstreamConnection.open(host, port, self.timeout, **self.tls_args(host))
        if self.sasl is None:
            return conn
        try:
            await self._authenticate(conn, self.sasl)
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _authenticate(self, conn: UpstreamConnection, sasl: UpstreamSasl) -> None:
        who = f"as {sasl.username!r} with {sasl.mechanism}"
        if ApiKey.SASL_HANDSHAKE not in conn.versions:
            raise UpstreamAuthError(f"SASL {who}: the broker does not offer SASL")
        # v1: SASL tokens travel in SaslAuthenticate requests (v0's bare tokens are legacy).
        handshake = await conn.request(
            ApiKey.SASL_HANDSHAKE,
            conn.pick_version(ApiKey.SASL_HANDSHAKE, ceiling=1),
            self.timeout,
            mechanism=sasl.mechanism,
        )
        if int(handshake.error_code) != 0:
            offered = ", ".join(str(m) for m in handshake.mechanisms or ())
            raise UpstreamAuthError(
                f"SASL {who}: handshake refused (error {int(handshake.error_code)}; "
                f"the broker offers {offered or 'nothing'})"
            )
        version = conn.pick_version(ApiKey.SASL_AUTHENTICATE, ceiling=2)
        client = sasl.client()
        message: bytes | None = client.first()
        try:
            while message is not None:
                resp = await conn.request(
                    ApiKey.SASL_AUTHENTICATE, version, self.timeout, auth_bytes=message
                )
                if int(resp.error_code) != 0:
                    # The broker's message is about the exchange, never echoes the password.
                    raise UpstreamAuthError(
                        f"SASL {who} failed: error {int(resp.error_code)}"
                        f" ({resp.error_message or 'no message'})"
                    )
                message = client.step(bytes(resp.auth_bytes))
                # SessionLifetimeMs (v1+), a timedelta in the codec's entities; 0 = unlimited.
                lifetime = getattr(resp, "session_lifetime", None)
                seconds = lifetime.total_seconds() if lifetime is not None else 0.0
                if seconds > 0:
                    # Reconnect a little before the broker's connections.max.reauth.ms ends.
                    conn.expires_at = time.monotonic() + seconds * 0.9
        except SaslClientError as exc:
            raise UpstreamAuthError(f"SASL {who}: {exc}") from None


def _describe(exc: Exception | None) -> str:
    if exc is None:
        return "no --upstream address"
    return str(exc) or type(exc).__name__
