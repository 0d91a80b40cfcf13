"""`upstream_tls:`/`upstream_sasl:` as librdkafka settings: one translation for every
confluent-kafka connection the proxy and its CLI open (proxy/net/kafka_settings.py)."""

from __future__ import annotations

from pathlib import Path

from sluice.proxy.net.kafka_settings import describe, librdkafka_settings, redacted
from sluice.proxy.net.tls import UpstreamTLS
from sluice.proxy.net.upstream_sasl import UpstreamSasl
from sluice.transforms.config import TransformSpec, with_security

SASL = UpstreamSasl("SCRAM-SHA-512", "sluice-proxy", "s3cret-pw")


def test_protocol_follows_the_sections_and_is_always_set() -> None:
    assert librdkafka_settings(None, None) == {"security.protocol": "PLAINTEXT"}
    assert librdkafka_settings(None, SASL)["security.protocol"] == "SASL_PLAINTEXT"
    assert librdkafka_settings(UpstreamTLS(), None)["security.protocol"] == "SSL"
    assert librdkafka_settings(UpstreamTLS(), SASL)["security.protocol"] == "SASL_SSL"


def test_tls_and_sasl_keys() -> None:
    tls = UpstreamTLS(ca=Path("/ca.pem"), cert=Path("/c.pem"), key=Path("/c.key"),
                      key_password="kp", check_hostname=False)
    conf = librdkafka_settings(tls, SASL)
    assert conf["ssl.ca.location"] == "/ca.pem"
    assert conf["ssl.certificate.location"] == "/c.pem"
    assert conf["ssl.key.location"] == "/c.key"
    assert conf["ssl.key.password"] == "kp"
    assert conf["ssl.endpoint.identification.algorithm"] == "none"
    assert conf["enable.ssl.certificate.verification"] == "true"
    assert (conf["sasl.mechanism"], conf["sasl.username"], conf["sasl.password"]) == (
        "SCRAM-SHA-512", "sluice-proxy", "s3cret-pw")
    assert librdkafka_settings(UpstreamTLS(), None)[
        "ssl.endpoint.identification.algorithm"] == "https"


def test_secrets_are_never_shown() -> None:
    conf = librdkafka_settings(UpstreamTLS(key_password="kp"), SASL)
    shown = redacted(conf)
    assert shown["sasl.password"] == "***" and shown["ssl.key.password"] == "***"
    assert "s3cret-pw" not in repr(shown) and "s3cret-pw" not in describe(conf)
    assert "s3cret-pw" not in repr(SASL)
    assert describe(conf) == "SASL_SSL as 'sluice-proxy' (SCRAM-SHA-512)"


def test_a_transforms_own_client_config_overrides_the_cluster_settings() -> None:
    spec = TransformSpec(name="t", inputs=("a",), output="b", filters=(),
                         client_config={"security.protocol": "SSL"})
    merged = with_security(spec, librdkafka_settings(UpstreamTLS(), SASL))
    assert merged.client_config["security.protocol"] == "SSL"
    assert merged.client_config["sasl.username"] == "sluice-proxy"
    assert with_security(spec, None) is spec
