"""The `server.properties` of one node of a local Apache Kafka cluster (sluice/kafka_broker.py).

A pure function of the node's id, every node's ports, its data folder and the run's
credentials: listeners, SASL and TLS per listener, the authorizer and its super users, and
replication settings that fit the cluster's size.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from sluice.kafka_security import ADMIN_USER, BROKER_USER, KafkaCredentials

HOST = "127.0.0.1"
# The listeners clients use, by name; each name is also its security protocol.
CLIENT_LISTENERS = ("PLAINTEXT", "SASL_PLAINTEXT", "SSL", "SASL_SSL")
# Plus the brokers' own: INTERNAL between brokers, CONTROLLER for the quorum.
ALL_LISTENERS = (*CLIENT_LISTENERS, "INTERNAL", "CONTROLLER")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-512")


def server_properties(
    node_id: int,
    ports: Mapping[int, Mapping[str, int]],
    data_dir: Path,
    creds: KafkaCredentials,
    *,
    anonymous_super_user: bool,
    advertised_ports: Mapping[str, int] | None = None,
) -> dict[str, str]:
    """Node `node_id`'s settings; `ports` maps every node id to its port per listener.
    `advertised_ports` (by listener) are announced to clients instead of the listeners' own
    ports: a test's TCP relay in front of the node then sees every connection a client makes
    after bootstrap."""
    mine = ports[node_id]
    announced = {**mine, **(advertised_ports or {})}

    def address(listener: str) -> str:
        return f"{HOST}:{mine[listener]}"

    replicas = str(min(len(ports), 3))
    min_isr = "2" if len(ports) >= 3 else "1"
    broker_pw = creds.passwords[BROKER_USER]
    internal_jaas = (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="{BROKER_USER}" password="{broker_pw}" user_{BROKER_USER}="{broker_pw}";'
    )
    plain_users = " ".join(
        f'user_{name}="{pw}"' for name, pw in creds.passwords.items() if name != BROKER_USER
    )
    client_plain_jaas = (
        f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};"
    )
    scram_jaas = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    super_users = [f"User:{BROKER_USER}", f"User:{ADMIN_USER}"]
    if anonymous_super_user:
        super_users.append("User:ANONYMOUS")
    protocols = {name: name for name in CLIENT_LISTENERS} | {
        "INTERNAL": "SASL_PLAINTEXT",
        "CONTROLLER": "SASL_PLAINTEXT",
    }
    return {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": ",".join(
            f"{n}@{HOST}:{p['CONTROLLER']}" for n, p in sorted(ports.items())
        ),
        "listeners": ",".join(f"{name}://{address(name)}" for name in ALL_LISTENERS),
        "advertised.listeners": ",".join(
            f"{name}://{HOST}:{announced[name]}" for name in ALL_LISTENERS if name != "CONTROLLER"
        ),
        "listener.security.protocol.map": ",".join(f"{k}:{v}" for k, v in protocols.items()),
        "inter.broker.listener.name": "INTERNAL",
        "controller.listener.names": "CONTROLLER",
        "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "sasl.mechanism.controller.protocol": "PLAIN",
        "sasl.enabled.mechanisms": ",".join(SASL_MECHANISMS),
        "listener.name.internal.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.internal.plain.sasl.jaas.config": internal_jaas,
        "listener.name.controller.plain.sasl.jaas.config": internal_jaas,
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": client_plain_jaas,
        "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": scram_jaas,
        "listener.name.sasl_ssl.plain.sasl.jaas.config": client_plain_jaas,
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": scram_jaas,
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": str(creds.broker_keystore),
        "ssl.keystore.password": creds.keystore_password,
        "ssl.key.password": creds.keystore_password,
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(creds.ca_cert),
        "listener.name.ssl.ssl.client.auth": "required",
        # User:<CN> for a certificate, like a SASL user of the same name.
        "ssl.principal.mapping.rules": "RULE:^CN=([^,]+)(,.*)?$/$1/,DEFAULT",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": ";".join(super_users),
        "allow.everyone.if.no.acl.found": "false",
        "log.dirs": str(data_dir),
        "num.partitions": "1",
        "default.replication.factor": replicas,
        "min.insync.replicas": min_isr,
        "offsets.topic.replication.factor": replicas,
        "offsets.topic.num.partitions": "10",
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": min_isr,
        "transaction.state.log.num.partitions": "10",
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": min_isr,
        "group.initial.rebalance.delay.ms": "0",
        # Few threads: a test broker on a 2-core machine.
        "num.network.threads": "2",
        "num.io.threads": "2",
        "num.recovery.threads.per.data.dir": "1",
        "background.threads": "2",
        "log.cleaner.threads": "1",
        # A killed node is fenced after 6 s instead of 9 s, and a stopping one is let go
        # sooner; leaders move to the survivors.
        "broker.heartbeat.interval.ms": "500",
        "broker.session.timeout.ms": "6000",
    }
