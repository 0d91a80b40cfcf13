"""One translation of `upstream_tls:` and `upstream_sasl:` into librdkafka's settings.

The proxy talks to the cluster on its own with two client stacks: its own small client
(upstream_client.py: dead letters, topic-id and config look-ups), which reads the two sections
directly, and confluent-kafka (librdkafka: the filter fleet, the Kafka telemetry sinks,
transforms, `sluice filter deploy/list/...`, `sluice transform list` and the audit's
`kafka://` source). `librdkafka_settings` is the only place that turns the sections into
librdkafka keys, so every one of those connections is secured the same way, from the same
config file. Nothing here logs; `redacted` is what may be shown of the result.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from sluice.proxy.net.tls import UpstreamTLS
    from sluice.proxy.net.upstream_sasl import UpstreamSasl
    from sluice.proxy.ops.config import ProxyConfig

#: librdkafka keys whose values are secrets: never printed, logged or put in an error.
SECRET_KEYS: Final = frozenset({"sasl.password", "ssl.key.password", "ssl.keystore.password"})


def librdkafka_settings(tls: UpstreamTLS | None, sasl: UpstreamSasl | None) -> dict[str, str]:
    """librdkafka (confluent-kafka) settings for a connection secured as the two sections say.

    `security.protocol` is always set (PLAINTEXT without either section), so a client config
    built from these settings is never silently in the clear when TLS or SASL is configured.
    `upstream_tls.server_hostname` has no librdkafka equivalent (it checks the broker's
    advertised host); `min_version` maps to librdkafka's OpenSSL default floor (TLS 1.2).
    """
    if tls is not None:
        protocol = "SASL_SSL" if sasl is not None else "SSL"
    else:
        protocol = "SASL_PLAINTEXT" if sasl is not None else "PLAINTEXT"
    conf: dict[str, str] = {"security.protocol": protocol}
    if tls is not None:
        if tls.ca is not None:
            conf["ssl.ca.location"] = str(tls.ca)
        if tls.cert is not None:
            conf["ssl.certificate.location"] = str(tls.cert)
        if tls.key is not None:
            conf["ssl.key.location"] = str(tls.key)
        if tls.key_password is not None:
            conf["ssl.key.password"] = tls.key_password
        # The chain is always verified (librdkafka's default); only the name check can go.
        conf["enable.ssl.certificate.verification"] = "true"
        conf["ssl.endpoint.identification.algorithm"] = "https" if tls.check_hostname else "none"
    if sasl is not None:
        conf["sasl.mechanism"] = sasl.mechanism
        conf["sasl.username"] = sasl.username
        conf["sasl.password"] = sasl.password
    return conf


def cluster_settings(config: ProxyConfig) -> dict[str, str]:
    """`librdkafka_settings` of a loaded config (its `upstream_tls` and `upstream_sasl`)."""
    return librdkafka_settings(config.upstream_tls, config.upstream_sasl)


def redacted(settings: Mapping[str, Any]) -> dict[str, Any]:
    """`settings` with every secret replaced by ``"***"`` (for messages and `--json` output)."""
    return {k: ("***" if k in SECRET_KEYS else v) for k, v in settings.items()}


def describe(settings: Mapping[str, Any]) -> str:
    """``SASL_SSL as 'sluice-proxy' (SCRAM-SHA-512)``: who connects how, for log lines."""
    protocol = str(settings.get("security.protocol", "PLAINTEXT"))
    user = settings.get("sasl.username")
    if user is None:
        return protocol
    return f"{protocol} as {user!r} ({settings.get('sasl.mechanism')})"
