"""What one hostile batch costs the proxy: decompression bombs and lying record counts.

Starts Tansu and `sluice serve` with builtin:pii-mask on produce and fetch for `bomb-*`, then
for each codec:

- produce: the kind (path + topic) is first taught to run inline with 10 one-record batches,
  then one Produce carrying a hostile batch, compressed;
- fetch: the same batch written straight to Tansu (which stores it), then fetched through the
  proxy.

Hostile batches (`--variants`): `bomb`, `--mib` MiB of 7-byte records, honestly declared;
`liar`, 64 MiB of them declared as one record (zstd: a streamed
frame, which declares no content size); `limit`, as many 7-byte records as
`limits.max_batch_records` allows by default (the most a batch may cost that passes).

While each bomb is processed another connection sends Metadata every 20 ms. Printed per case:
the proxy process's CPU seconds (user + system, psutil) and peak RSS growth (sampled every
5 ms) over the exchange, the answer's size and time, the partition error code, and the slowest
Metadata answer.

    .venv/bin/python -m bench.bench_bombs [--mib 10] [--codecs zstd,gzip,lz4,snappy]
        [--variants bomb,liar,limit]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from sluice.codec.batch_limits import DEFAULT_MAX_BATCH_RECORDS
from sluice.codec.compression import CODEC_NAMES
from sluice.codec.messages import ApiKey
from sluice.local_broker import TansuBroker
from tests.e2e.clients import create_topic, unique
from tests.harness.hostile_batches import (
    TINY_RECORD,
    MiB,
    ProcessWatch,
    bomb,
    first_partition,
    lying_bomb,
    produce_records_frame,
)
from tests.harness.proxy import SluiceProxy
from tests.harness.raw_kafka import connect, fetch_frame, produce_frame, recv_frame

CONFIG = """\
filters:
  - name: pii
    module: builtin:pii-mask
    topics: ["bomb-*"]
    apply_to: [produce, fetch]
"""


def measure(proxy: SluiceProxy, frame: bytes, api_key: int, version: int) -> dict[str, Any]:
    assert proxy.process is not None
    watch = ProcessWatch(proxy.process.pid, proxy.port)
    watch.start()
    time.sleep(0.1)
    with connect(proxy.port, timeout=120) as sock:
        start = time.monotonic()
        sock.sendall(frame)
        body = recv_frame(sock)
        elapsed = time.monotonic() - start
    figures = watch.finish()
    assert body is not None
    return {
        "cpu_s": figures["cpu_s"],
        "rss_growth_mib": figures["rss_growth_mib"],
        "answer_bytes": len(body) + 4,
        "answer_s": round(elapsed, 3),
        "error_code": int(first_partition(api_key, version, body).error_code),
        "metadata_slowest_s": figures["metadata_slowest_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=10)
    parser.add_argument("--codecs", default="zstd,gzip,lz4,snappy")
    parser.add_argument("--variants", default="bomb,liar,limit")
    args = parser.parse_args()
    codecs = [CODEC_NAMES.index(c) for c in args.codecs.split(",")]
    variants = {
        "bomb": lambda codec: bomb(codec, args.mib * MiB),
        # zstd without the content size in its frame (a streaming compressor's): with it, the
        # frame header alone is refused.
        "liar": lambda codec: lying_bomb(codec, 64 * MiB, declared=1, sized=False),
        "limit": lambda codec: bomb(codec, DEFAULT_MAX_BATCH_RECORDS * len(TINY_RECORD)),
    }
    cases = [(c, v) for c in codecs for v in args.variants.split(",")]
    with TansuBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sluice.yaml"
        path.write_text(CONFIG, encoding="utf-8")
        with SluiceProxy(upstream=broker.bootstrap, config=path) as proxy:
            for codec, variant in cases:
                name = f"{CODEC_NAMES[codec]} {variant}"
                batch = variants[variant](codec)
                topic = unique(f"bomb-{CODEC_NAMES[codec]}")
                create_topic(broker.bootstrap, topic)
                with connect(proxy.port) as sock:  # teach the placement this kind is fast
                    for n in range(1, 11):
                        sock.sendall(produce_frame(n, topic, [b"warm-up %d" % n]))
                        recv_frame(sock)
                frame = produce_records_frame(99, topic, batch)
                row = {"case": f"produce {name}", "request_bytes": len(frame),
                       **measure(proxy, frame, ApiKey.PRODUCE, 9)}
                print(json.dumps(row), flush=True)
                stored = unique(f"bomb-stored-{CODEC_NAMES[codec]}")
                create_topic(broker.bootstrap, stored)
                port = broker.bootstrap.rsplit(":", 1)[1]
                with connect(int(port)) as sock:
                    sock.sendall(produce_records_frame(1, stored, batch))
                    answer = recv_frame(sock)
                assert answer is not None
                code = int(first_partition(ApiKey.PRODUCE, 9, answer).error_code)
                row = {"case": f"fetch {name}", "stored_error": code,
                       **measure(proxy, fetch_frame(7, stored, max_wait_ms=100,
                                                    partition_max_bytes=64 * MiB),
                                 ApiKey.FETCH, 12)}
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
