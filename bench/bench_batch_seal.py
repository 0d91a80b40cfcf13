"""In-process micro-benchmark of sealing and opening one batch with builtin:encrypt's
whole-value mode: CPU µs per record (time.thread_time, so other load on the machine counts
little) for 100 records of 200-byte values per batch.

    .venv/bin/python -m bench.bench_batch_seal [--batch 100] [--size 200] [--rounds 7]
                                               [--gcm own|evp]

Rows (median of `--rounds`, each round sealing or opening enough batches for ~0.2 s):

  aesgcm loop      cryptography's AESGCM called per record from Python with the layout-2
                   associated data (digest and AAD built per record): the floor of any
                   per-record Python path
  reference        EncryptRunner.run on decoded records (the per-record path, Decisions)
  native           EncryptRunner.run_native on the records section: one call into
                   crypto/batch_seal.c per batch (OpenSSL EVP through cffi)

`--gcm evp` runs the native rows' AES-GCM through OpenSSL's EVP instead of the module's own
AES-NI code (crypto/batch_seal.c; the same bytes). The pipeline around it (CRC, batch
rebuild, codec) is measured by bench.bench_encryption.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sluice.codec.records import Record, decode_section, encode_records
from sluice.crypto import batch_seal
from sluice.crypto.envelope import (
    MODE_VALUE,
    aad_for,
    aad_prefix_v2,
    record_digest,
)
from sluice.crypto.kms import KmsSettings
from sluice.crypto.record_filter import EncryptRunner
from sluice.filters.config import FilterSpec
from sluice.filters.context import RecordContext

TOPIC = "payments"
PRODUCE = RecordContext(TOPIC, 0, "produce", principal="User:app")
FETCH = RecordContext(TOPIC, 0, "fetch", principal="User:billing")


def per_record_us(run: Callable[[], object], records: int, rounds: int) -> float:
    """Median CPU µs per record of `run` (one batch of `records`)."""
    started = time.thread_time()
    n = 0
    while time.thread_time() - started < 0.05:
        run()
        n += 1
    reps = max(1, int(n * 4))  # ~0.2 s per round
    samples = []
    for _ in range(rounds):
        t0 = time.thread_time()
        for _ in range(reps):
            run()
        samples.append((time.thread_time() - t0) / reps / records * 1e6)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--gcm", choices=("own", "evp"), default="own")
    args = parser.parse_args(argv)
    if batch_seal.AVAILABLE:
        batch_seal.allow_own_gcm(args.gcm == "own")
    records = [Record(i, i, b"key-%d" % i, os.urandom(args.size // 2).hex().encode()[:args.size],
                      [("trace", b"t-%d" % i)], 0) for i in range(args.batch)]
    section = bytes(encode_records(records))
    with tempfile.TemporaryDirectory() as tmp:
        spec = FilterSpec(name="enc", module="builtin:encrypt", topics=(TOPIC,),
                          apply_to=frozenset({"produce", "fetch"}),
                          kms=KmsSettings("local", path=str(Path(tmp) / "keys.json")),
                          config={"key": "payments", "decrypt_for": ["User:billing"]})
        runner = EncryptRunner(spec, "enc")
        sealed_out = runner.run_native(PRODUCE, section, len(records), 0, 0)
        assert sealed_out is not None and sealed_out.records is not None
        sealed = sealed_out.records
        stored = decode_section(sealed, len(records))
        key = runner.keys.for_encrypt("payments", 0)
        prefix = aad_prefix_v2(MODE_VALUE, key.key_name, key.key_version, key.wrapped, "enc",
                               TOPIC)
        aead = key.aead

        def loop_seal() -> None:
            nonces = os.urandom(12 * len(records))
            for n, r in enumerate(records):
                nonce = nonces[n * 12:n * 12 + 12]
                aead.encrypt(nonce, r.value or b"", aad_for(prefix, r.key, "",
                                                            record_digest(r.headers)))

        opened = [(r.key, (r.value or b"")[1:13], (r.value or b"")[13:], r.headers[:-1])
                  for r in stored]  # [:-1]: the proxy's one header (layout 3)

        def loop_open() -> None:
            for k, nonce, ct, own in opened:
                aead.decrypt(nonce, ct, aad_for(prefix, k, "", record_digest(own)))

        rows: list[tuple[str, Callable[[], object], Callable[[], object]]] = [
            ("aesgcm loop", loop_seal, loop_open)]
        rows.append(("reference",
                     lambda: runner.run(PRODUCE, records, 0, 0) and None,
                     lambda: runner.run(FETCH, stored, 0, 0) and None))
        if batch_seal.AVAILABLE:
            rows.append(("native",
                         lambda: runner.run_native(PRODUCE, section, len(records), 0, 0) and None,
                         lambda: runner.run_native(FETCH, sealed, len(records), 0, 0) and None))
        gcm = "own AES-GCM" if batch_seal.AVAILABLE and batch_seal.own_gcm() else "EVP"
        print(f"{args.batch} records of {args.size} bytes per batch, CPU µs per record "
              f"(thread_time), median of {args.rounds} rounds; native AES-GCM: {gcm}")
        for name, seal, open_ in rows:
            print(f"  {name:12s} seal {per_record_us(seal, len(records), args.rounds):6.2f}"
                  f"   open {per_record_us(open_, len(records), args.rounds):6.2f}")


if __name__ == "__main__":
    main()
