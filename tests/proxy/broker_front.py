"""A test stand-in for broker features Tansu 0.6 lacks: TLS and SASL authentication.

`BrokerFront` listens on its own port and relays to a Tansu broker that advertises the front's
address (so every connection a client learns from Metadata comes back through it). It can

* terminate TLS (optionally requiring a client certificate), like a broker's SSL listener;
* authenticate SASL itself, like a broker's SASL listener: SaslHandshake and SaslAuthenticate
  are answered here (PLAIN and SCRAM-SHA-256/512 as in RFC 4616 / RFC 5802, checked against
  a user table), and any other request before a successful authentication closes the
  connection, as Kafka does.

Tansu's own `--cert/--key` flags cannot be combined in this build, and its `--authentication`
mode refuses the `tansu user create` call that would add the first user (memory storage).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import os
import secrets
import ssl
import struct
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice.codec import entities
from sluice.codec.headers import RequestHeader, parse_request_header, response_header_bytes
from sluice.codec.messages import ApiKey, decode_request, encode_response
from tests.harness.broker import tansu_binary
from tests.harness.ports import free_port, wait_for_port

_SIZE = struct.Struct(">i")
SASL_AUTHENTICATION_FAILED = 58
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


# ------------------------------------------------------------------ SASL server side


@dataclass
class _Scram:
    hash_name: str
    user: str
    client_first_bare: str
    server_first: str
    salted: bytes


@dataclass
class SaslServer:
    """Per-connection SASL state of the stand-in broker."""

    users: dict[str, str]
    mechanism: str | None = None
    authenticated: str | None = None
    scram: _Scram | None = None
    iterations: int = 4096
    salt: bytes = field(default_factory=lambda: os.urandom(16))

    def handshake(self, mechanism: str) -> int:
        if mechanism not in MECHANISMS:
            return UNSUPPORTED_SASL_MECHANISM
        self.mechanism = mechanism
        return 0

    def step(self, data: bytes) -> tuple[int, str | None, bytes]:
        """(error code, error message, server bytes) for one client message."""
        if self.mechanism == "PLAIN":
            parts = data.split(b"\x00")
            if len(parts) == 3:
                user, password = parts[1].decode(), parts[2].decode()
                if self.users.get(user) == password:
                    self.authenticated = user
                    return 0, None, b""
            return SASL_AUTHENTICATION_FAILED, "Authentication failed: invalid credentials", b""
        if self.mechanism in _HASHES:
            return self._scram_step(data)
        return ILLEGAL_SASL_STATE, "no handshake", b""

    def _scram_step(self, data: bytes) -> tuple[int, str | None, bytes]:
        text = data.decode()
        assert self.mechanism is not None
        if self.scram is None:
            bare = text.split(",", 2)[2]
            attrs = dict(a.split("=", 1) for a in bare.split(","))
            user = attrs["n"].replace("=2C", ",").replace("=3D", "=")
            password = self.users.get(user, secrets.token_hex(8))
            nonce = attrs["r"] + secrets.token_hex(12)
            server_first = (
                f"r={nonce},s={base64.b64encode(self.salt).decode()},i={self.iterations}"
            )
            hash_name = _HASHES[self.mechanism]
            salted = hashlib.pbkdf2_hmac(hash_name, password.encode(), self.salt, self.iterations)
            self.scram = _Scram(hash_name, user, bare, server_first, salted)
            return 0, None, server_first.encode()
        s = self.scram
        without_proof, _, proof_b64 = text.rpartition(",p=")
        auth_message = f"{s.client_first_bare},{s.server_first},{without_proof}".encode()
        client_key_mac = hmac.new(s.salted, b"Client Key", s.hash_name).digest()
        stored_key = hashlib.new(s.hash_name, client_key_mac).digest()
        signature = hmac.new(stored_key, auth_message, s.hash_name).digest()
        proof = base64.b64decode(proof_b64)
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if s.user not in self.users or hashlib.new(s.hash_name, client_key).digest() != stored_key:
            return SASL_AUTHENTICATION_FAILED, "Authentication failed during authentication", b""
        server_key = hmac.new(s.salted, b"Server Key", s.hash_name).digest()
        server_sig = hmac.new(server_key, auth_message, s.hash_name).digest()
        self.authenticated = s.user
        return 0, None, b"v=" + base64.b64encode(server_sig)


def _response(header: RequestHeader, **fields: Any) -> bytes:
    cls = entities.response_class(header.api_key, header.api_version)
    body = encode_response(entities.build(cls, **fields))
    head = response_header_bytes(header.correlation_id, header.api_key, header.api_version)
    return _SIZE.pack(len(head) + len(body)) + head + body


# ------------------------------------------------------------------ the relay


class BrokerFront:
    """Relay 127.0.0.1:port -> 127.0.0.1:target with optional TLS and SASL termination."""

    def __init__(
        self,
        target_port: int,
        port: int = 0,
        ssl_context: ssl.SSLContext | None = None,
        sasl_users: dict[str, str] | None = None,
    ) -> None:
        self.target_port = target_port
        self.port = port or free_port()
        self.ssl_context = ssl_context
        self.sasl_users = sasl_users
        self.connections = 0
        self.authenticated: list[str] = []
        self.auth_failures = 0
        self.handshake_failures = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._started = threading.Event()

    def start(self) -> BrokerFront:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("broker front did not start")
        return self

    def _run(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        loop.set_exception_handler(self._on_loop_error)

        async def main() -> None:
            self._server = await asyncio.start_server(
                self._serve, "127.0.0.1", self.port, ssl=self.ssl_context
            )
            self._started.set()
            async with self._server:
                await self._server.serve_forever()

        try:
            loop.run_until_complete(main())
        except (asyncio.CancelledError, RuntimeError):
            pass
        finally:
            loop.close()

    def _on_loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if isinstance(context.get("exception"), ssl.SSLError):
            self.handshake_failures += 1

    def stop(self) -> None:
        loop, server = self._loop, self._server
        if loop is not None and server is not None and not loop.is_closed():
            loop.call_soon_threadsafe(server.close)
            for task in asyncio.all_tasks(loop):
                loop.call_soon_threadsafe(task.cancel)
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> BrokerFront:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        sasl = SaslServer(self.sasl_users) if self.sasl_users is not None else None
        back = asyncio.create_task(self._pipe(up_reader, writer))
        try:
            while True:
                size_bytes = await reader.readexactly(4)
                body = await reader.readexactly(_SIZE.unpack(size_bytes)[0])
                if sasl is not None and not self._sasl_request(sasl, body, writer):
                    return
                if sasl is None or parse_request_header(body).api_key not in (17, 36):
                    up_writer.write(size_bytes + body)
                    await up_writer.drain()
                else:
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            back.cancel()
            up_writer.close()
            writer.close()

    def _sasl_request(self, sasl: SaslServer, body: bytes, writer: asyncio.StreamWriter) -> bool:
        """Answer SASL requests; False closes the connection (unauthenticated traffic)."""
        header = parse_request_header(body)
        payload = body[header.header_size :]
        if header.api_key == ApiKey.SASL_HANDSHAKE:
            request = decode_request(header.api_key, header.api_version, payload)
            code = sasl.handshake(str(request.mechanism))
            writer.write(_response(header, error_code=code, mechanisms=MECHANISMS))
            return True
        if header.api_key == ApiKey.SASL_AUTHENTICATE:
            request = decode_request(header.api_key, header.api_version, payload)
            code, message, data = sasl.step(bytes(request.auth_bytes))
            fields: dict[str, Any] = {
                "error_code": code,
                "error_message": message,
                "auth_bytes": data,
            }
            if header.api_version >= 1:
                fields["session_lifetime_ms"] = 0
            writer.write(_response(header, **fields))
            if code == 0 and sasl.authenticated and sasl.authenticated not in self.authenticated:
                self.authenticated.append(sasl.authenticated)
            if code != 0:
                self.auth_failures += 1
            return True
        # Kafka allows only ApiVersions before authentication.
        return sasl.authenticated is not None or header.api_key == ApiKey.API_VERSIONS

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()


@dataclass
class FrontedTansu:
    """A Tansu broker that advertises a BrokerFront's address, and that front."""

    front_kwargs: dict[str, Any] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    front: BrokerFront | None = None
    log_path: Path | None = None

    @property
    def bootstrap(self) -> str:
        assert self.front is not None
        return f"127.0.0.1:{self.front.port}"

    def start(self) -> FrontedTansu:
        tansu_port, front_port = free_port(), free_port()
        fd, name = tempfile.mkstemp(prefix="tansu-front-", suffix=".log")
        os.close(fd)
        self.log_path = Path(name)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    str(tansu_binary()),
                    "broker",
                    "--listener-url",
                    f"tcp://127.0.0.1:{tansu_port}",
                    "--advertised-listener-url",
                    f"tcp://127.0.0.1:{front_port}",
                    "--storage-engine",
                    "memory://tansu/",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(os.environ, RUST_LOG="warn"),
            )
        try:
            wait_for_port(tansu_port, timeout=15)
            self.front = BrokerFront(tansu_port, front_port, **self.front_kwargs).start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.front is not None:
            self.front.stop()
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)

    def __enter__(self) -> FrontedTansu:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
