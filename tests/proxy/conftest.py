"""Fixtures shared by the proxy tests: a broker behind a TLS listener that wants client
certificates (test_tls.py, test_upstream_dialer.py)."""

from __future__ import annotations

import ssl
from collections.abc import Iterator

import pytest

from tests.proxy.broker_front import FrontedTansu
from tests.proxy.tls_certs import Pki, make_pki


@pytest.fixture(scope="module")
def broker_pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    # The broker's certificate names only broker.test, not the 127.0.0.1 the proxy dials.
    return make_pki(tmp_path_factory.mktemp("broker-pki"), server_names=["broker.test"])


@pytest.fixture(scope="module")
def tls_broker(broker_pki: Pki) -> Iterator[FrontedTansu]:
    """Tansu behind a TLS listener that requires a client certificate signed by the CA."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(broker_pki.server_cert, broker_pki.server_key)
    ctx.load_verify_locations(broker_pki.ca)
    ctx.verify_mode = ssl.CERT_REQUIRED
    with FrontedTansu(front_kwargs={"ssl_context": ctx}) as b:
        yield b
