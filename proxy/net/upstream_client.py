"""A minimal Kafka client the proxy uses for its own requests to the cluster.

Used off the client data path: producing dead letters, looking up current topic configs for
admin policy checks. One short-lived connection per call keeps it simple; these calls are rare.
"""

from __future__ import annotations

import asyncio
import itertools
import struct
from typing import Any

from sluice.codec import entities, schemas
from sluice.codec.frames import FrameBuffer
from sluice.codec.headers import request_header_bytes, response_header_size
from sluice.codec.messages import (
    ApiKey,
    codec_version_range,
    decode_response,
    encode_request,
)

_SIZE = struct.Struct(">i")
_ids = itertools.count(1)
CLIENT_ID = "sluice-proxy"


class UpstreamError(Exception):
    pass


class UpstreamConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._frames = FrameBuffer()
        self._ready: list[Any] = []
        self.versions: dict[int, tuple[int, int]] = {}

    @classmethod
    async def open(
        cls, host: str, port: int, timeout: float = 10, **tls: Any
    ) -> UpstreamConnection:
        """Connect and negotiate versions; `tls` is ProxyServer.upstream_tls_args(host)."""
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, **tls), timeout)
        conn = cls(reader, writer)
        resp = await conn.request(
            ApiKey.API_VERSIONS, 3, client_software_name="sluice", client_software_version="0.1.0"
        )
        for entry in resp.api_keys:
            conn.versions[int(entry.api_key)] = (int(entry.min_version), int(entry.max_version))
        return conn

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
