"""builtin:encrypt jobs on the event loop: small batches of a proven kind run inline (the hop
to the filter thread pool costs more than sealing them), and a job that would wait there (its
data key expired, so the KMS must be asked) goes to the pool instead of stalling the loop.

A real `sluice serve` with builtin:encrypt (local keyring) in front of Tansu, raw Produce
frames, and a confluent-kafka consumer reading back through the proxy.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluice.codec.messages import ApiKey
from tests.e2e.clients import confluent_consume, create_topic, unique
from tests.harness.hostile_batches import first_partition
from tests.harness.ports import free_port
from tests.harness.proxy import SluiceProxy
from tests.harness.raw_kafka import connect, produce_frame, recv_frame, scrape, series

# Counts where jobs ran, which a busy machine moves: run alone.
pytestmark = pytest.mark.serial


def jobs_where(metrics_port: int, where: str) -> float:
    (line,) = [x for x in series(scrape(metrics_port), "sluice_filter_jobs_total")
               if f'where="{where}"' in x]
    return float(line.rsplit(" ", 1)[1])


@pytest.mark.parametrize("codec", [0, 3], ids=["none", "lz4"])
def test_small_encrypt_jobs_run_inline_and_a_kms_call_goes_to_the_pool(
    broker: Any, tmp_path: Path, codec: int
) -> None:
    """Uncompressed batches, and LZ4 ones (the frame is held to what its block headers allow,
    so the job's size is known without decompressing it)."""
    topic = unique("inline-enc")
    create_topic(broker.bootstrap, topic)
    metrics = free_port()
    config = {
        "metrics": {"listen": f"127.0.0.1:{metrics}"},
        "kms": {"type": "local", "path": str(tmp_path / "keys.json")},
        "filters": [{"name": "enc", "module": "builtin:encrypt", "topics": ["inline-enc-*"],
                     "apply_to": ["produce", "fetch"],
                     "config": {"key": "k", "decrypt_for": ["User:ANONYMOUS"],
                                "data_key_cache_seconds": 2}}],
    }
    path = tmp_path / "sluice.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    sent: list[bytes] = []
    with SluiceProxy(upstream=broker.bootstrap, config=path) as proxy, \
            connect(proxy.port) as sock:

        def produce(n: int) -> None:
            value = b'{"n": %d}' % n
            sock.sendall(produce_frame(n, topic, [value], codec=codec))
            answer = recv_frame(sock)
            assert answer is not None
            assert first_partition(ApiKey.PRODUCE, 9, answer).error_code == 0
            sent.append(value)

        # A run over 0.5 ms (a cold thread) sets the kind back: produce until it is inline.
        n = 0
        while jobs_where(metrics, "inline") < 3 and n < 300:
            n += 1
            produce(n)
        inline, pool = jobs_where(metrics, "inline"), jobs_where(metrics, "pool")
        assert inline >= 3, f"encrypt jobs never ran inline ({inline} inline, {pool} pool)"
        # The data key expires: the next batch needs the KMS, which the loop may not wait
        # for. It goes to the pool, and is sealed there like any other.
        time.sleep(2.5)
        produce(n + 1)
        assert jobs_where(metrics, "pool") == pool + 1
        assert jobs_where(metrics, "inline") == inline
        got = confluent_consume(proxy.bootstrap, topic, len(sent))
    assert [value for _key, value in got] == sent
