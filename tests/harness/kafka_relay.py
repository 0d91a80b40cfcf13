"""An Apache Kafka node whose client listeners are announced at TCP relays that count connections.

The proxy's own client (dead letters, look-ups) learns broker addresses from Metadata, so a
relay only sees its connections if the broker announces the relay's port. `RelayedKafka`
starts a node of its own (not the session's shared one) with `advertised_ports` pointing at
one `CountingRelay` per client listener. A relay copies bytes both ways and understands
nothing: TLS, SASL, principals and ACLs are Kafka's own, the relay only counts TCP connections.
Its SASL_PLAINTEXT listener also offers SCRAM-SHA-256 (the proxy's dialer speaks it), and
SCRAM-SHA-256 sessions there last `REAUTH_MS` (Kafka's `connections.max.reauth.ms`), so a
test can watch the dialer replace a connection before the broker's session ends.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from confluent_kafka.admin import AclBinding, AclOperation, ResourceType, ScramMechanism

from tests.harness.kafka_admin import KafkaAdmin, wait_until
from tests.harness.kafka_broker import KafkaCluster
from tests.harness.ports import free_port

RELAYED = ("PLAINTEXT", "SASL_PLAINTEXT", "SSL")
# The SASL session a SCRAM-SHA-256 login on SASL_PLAINTEXT gets (ms).
REAUTH_MS = 4000


class CountingRelay:
    """127.0.0.1:port -> 127.0.0.1:target, byte for byte, in a thread; counts connections.

    `stop()` frees the port (a test may put its own relay there for a while), `start()`
    takes it again."""

    def __init__(self, target_port: int, port: int) -> None:
        self.target_port, self.port = target_port, port
        self.connections = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._open: set[asyncio.StreamWriter] = set()

    def start(self) -> CountingRelay:
        started = threading.Event()

        def run() -> None:
            loop = self._loop = asyncio.new_event_loop()

            async def main() -> None:
                self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
                started.set()
                async with self._server:
                    await self._server.serve_forever()

            try:
                loop.run_until_complete(main())
            except (asyncio.CancelledError, RuntimeError):
                pass
            finally:
                rest = asyncio.all_tasks(loop)
                for task in rest:
                    task.cancel()
                if rest:
                    loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
                loop.close()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError(f"relay on port {self.port} did not start")
        return self

    def stop(self) -> None:
        loop, server = self._loop, self._server

        def shut() -> None:
            server.close()
            for writer in list(self._open):
                writer.close()
            for task in asyncio.all_tasks():
                task.cancel()

        if loop is not None and server is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(shut)
            except RuntimeError:
                pass
        if self._thread is not None:
            self._thread.join(5)
        self._loop = self._server = self._thread = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._open.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            self._open.discard(writer)
            writer.close()
            return
        back = asyncio.create_task(_pipe(up_reader, writer))
        try:
            await _pipe(reader, up_writer)
        finally:
            back.cancel()
            self._open.discard(writer)
            up_writer.close()
            writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


@dataclass
class RelayedKafka:
    """One Kafka node, its client listeners announced at counting relays."""

    cluster: KafkaCluster = field(init=False)
    relays: dict[str, CountingRelay] = field(default_factory=dict)

    def __post_init__(self) -> None:
        ports = {name: free_port() for name in RELAYED}
        scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        self.cluster = KafkaCluster(
            nodes=1,
            advertised_ports=ports,
            extra_config={
                "listener.name.sasl_plaintext.sasl.enabled.mechanisms":
                    "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
                "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config": scram,
                "listener.name.sasl_plaintext.scram-sha-256.connections.max.reauth.ms":
                    str(REAUTH_MS),
            },
        )
        self._ports = ports

    def start(self) -> RelayedKafka:
        self.cluster.start()
        node = self.cluster.node_list[0]
        try:
            for name, port in self._ports.items():
                self.relays[name] = CountingRelay(node.ports[name], port).start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for relay in self.relays.values():
            relay.stop()
        self.cluster.stop()

    def __enter__(self) -> RelayedKafka:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def bootstrap(self, listener: str = "PLAINTEXT") -> str:
        """The relay's address for `listener` (what the node announces)."""
        return f"127.0.0.1:{self.relays[listener].port}"

    def target_port(self, listener: str) -> int:
        return self.cluster.node_list[0].ports[listener]

    def admin(self) -> KafkaAdmin:
        """The super user `admin`, on the node's own SASL_PLAINTEXT port (not relayed)."""
        return KafkaAdmin(self.cluster, f"127.0.0.1:{self.target_port('SASL_PLAINTEXT')}")

    def add_scram_user(self, user: str, password: str,
                       mechanisms: Iterable[ScramMechanism]) -> None:
        self.admin().add_scram_user(user, password, mechanisms)

    def remove_scram_user(self, user: str, mechanisms: Iterable[ScramMechanism]) -> None:
        self.admin().remove_scram_user(user, mechanisms)

    def grant(self, principal: str, topic: str, *operations: AclOperation,
              prefixed: bool = False) -> list[AclBinding]:
        return self.admin().grant(principal, ResourceType.TOPIC, topic, *operations,
                                  prefixed=prefixed)

    def revoke(self, bindings: list[AclBinding]) -> None:
        self.admin().revoke(bindings)


__all__ = ["REAUTH_MS", "CountingRelay", "RelayedKafka", "wait_until"]
