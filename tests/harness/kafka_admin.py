"""The super user's hand on a test Kafka: SCRAM users and ACLs made at run time, and taken back.

Tests share one Kafka node per session (`kafka_broker`), so whatever a test module adds (a
user, an ACL) it removes again; these helpers return what they made for that purpose."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from confluent_kafka import KafkaError
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from tests.harness.kafka_broker import KafkaCluster

_QUIET = {"log_level": 0, "logger": lambda *_: None}


class KafkaAdmin:
    """`admin` (a super user) over SCRAM-SHA-512 on `bootstrap` (default: SASL_PLAINTEXT)."""

    def __init__(self, cluster: KafkaCluster, bootstrap: str | None = None) -> None:
        conf = cluster.client_config("SASL_PLAINTEXT", "admin", "SCRAM-SHA-512")
        if bootstrap is not None:
            conf["bootstrap.servers"] = bootstrap
        # One client for every call: librdkafka fails the futures of a destroyed client.
        self.client = AdminClient({**conf, **_QUIET})

    def add_scram_user(self, user: str, password: str,
                       mechanisms: Iterable[ScramMechanism] = (ScramMechanism.SCRAM_SHA_512,)
                       ) -> None:
        for mechanism in mechanisms:  # Kafka takes one alteration per user and request
            upsert = UserScramCredentialUpsertion(
                user, ScramCredentialInfo(mechanism, 4096), password.encode()
            )
            for future in self.client.alter_user_scram_credentials([upsert]).values():
                future.result(20)

    def remove_scram_user(self, user: str,
                          mechanisms: Iterable[ScramMechanism] = (ScramMechanism.SCRAM_SHA_512,)
                          ) -> None:
        for mechanism in mechanisms:
            deletion = UserScramCredentialDeletion(user, mechanism)
            for future in self.client.alter_user_scram_credentials([deletion]).values():
                future.result(20)

    def grant(self, principal: str, kind: ResourceType, name: str, *operations: AclOperation,
              prefixed: bool = False) -> list[AclBinding]:
        pattern = ResourcePatternType.PREFIXED if prefixed else ResourcePatternType.LITERAL
        bindings = [AclBinding(kind, name, pattern, principal, "*", op, AclPermissionType.ALLOW)
                    for op in operations]
        self.create_acls(bindings)
        return bindings

    def create_acls(self, bindings: list[AclBinding]) -> None:
        for future in self.client.create_acls(bindings).values():
            future.result(20)
        self._wait_applied(bindings, present=True)

    def revoke(self, bindings: list[AclBinding]) -> None:
        for future in self.client.delete_acls([_filter(b) for b in bindings]).values():
            future.result(20)
        self._wait_applied(bindings, present=False)

    def _wait_applied(self, bindings: list[AclBinding], present: bool,
                      timeout: float = 20.0) -> None:
        """Until the broker's authorizer (which DescribeAcls reads) shows the change: the
        controller acknowledges it before the broker has applied it from the metadata log."""
        deadline = time.monotonic() + timeout
        for binding in bindings:
            while True:
                found = self.client.describe_acls(_filter(binding)).result(20)
                if bool(found) == present:
                    break
                if time.monotonic() > deadline:
                    raise AssertionError(f"ACL {binding} not {'added' if present else 'removed'}")
                time.sleep(0.05)


def _filter(b: AclBinding) -> AclBindingFilter:
    return AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal, b.host,
                            b.operation, b.permission_type)


def wait_until(check: Any, timeout: float = 20.0, what: str = "condition") -> Any:
    """`check()` until it returns something true (exceptions count as not yet): a broker applies
    new users and ACLs through its metadata log, a moment after it acknowledged them."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            found = check()
            if found:
                return found
        except Exception as exc:
            last = exc
        time.sleep(0.2)
    raise AssertionError(f"{what} not reached in {timeout} s (last error: {last})")


def create_topics(bootstrap: str, topics: list[NewTopic]) -> dict[str, str | None]:
    """CreateTopics through `bootstrap`: each topic's outcome, None when created, else
    "ERROR_NAME: message" as the broker (or a policy in front of it) answered."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **_QUIET})
    out: dict[str, str | None] = {}
    for name, fut in admin.create_topics(topics, request_timeout=20).items():
        try:
            fut.result(30)
            out[name] = None
        except Exception as exc:
            err = exc.args[0] if exc.args else None
            out[name] = (f"{err.name()}: {err.str()}" if isinstance(err, KafkaError)
                         else str(exc))
    return out
