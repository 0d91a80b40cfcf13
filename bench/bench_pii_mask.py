"""Per-record cost of builtin:pii-mask through the host runtime (no broker, no network).

    python -m bench.bench_pii_mask [--records 20000] [--batch 100] [--rounds 5]

Records are ~200-byte JSON values (as bench.bench_proxy sends); batches of 100 go through
``LoadedFilter.run_batch``, the call the proxy makes per partition batch, so the figure
includes the ABI encoding, the Wasm call and the decoding of decisions. Variants:

  pii-mask/pii      every record holds an e-mail address, every third a card number
  pii-mask/clean    the same shape without personal data (nothing to rewrite)
  pii-mask/fields   pii records, with field paths configured as well
  json-validate     a cheap builtin over the same records: the host's fixed cost per batch

Prints records/s and µs/record (median of the rounds) per variant.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

from sluice.filters.config import FilterSpec
from sluice.filters.context import FilterRecord, RecordContext
from sluice.filters.runtime import LoadedFilter, load_filter


def json_values(n: int, pii: bool, size: int = 200, seed: int = 7) -> list[bytes]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        doc: dict[str, Any] = {
            "user_id": f"u{rng.randrange(10**6)}",
            "email": f"user{i}@example.com" if pii else f"user{i} at example",
            "card": "4111 1111 1111 1111" if pii and i % 3 == 0 else "order-12345",
            "amount": rng.randrange(10**5) / 100,
            "event": rng.choice(["click", "view", "buy"]),
            "note": "",
        }
        raw = json.dumps(doc)
        doc["note"] = "x" * max(0, size - len(raw))
        out.append(json.dumps(doc).encode())
    return out


def measure(f: LoadedFilter, values: list[bytes], batch: int, rounds: int) -> tuple[float, int]:
    ctx = RecordContext(topic="bench", partition=0, direction="produce", client_id="bench")
    batches = [
        [FilterRecord(j, 0, None, v, []) for j, v in enumerate(values[i : i + batch])]
        for i in range(0, len(values), batch)
    ]
    for b in batches[:10]:  # warm-up
        f.run_batch(ctx, b)
    rates = []
    rewritten = 0
    for _ in range(rounds):
        rewritten = 0
        start = time.perf_counter()
        for b in batches:
            res = f.run_batch(ctx, b)
            rewritten += sum(1 for d in res.decisions if d.action.name == "REWRITE")
        rates.append(len(values) / (time.perf_counter() - start))
    return statistics.median(rates), rewritten


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    pii = json_values(args.records, pii=True)
    clean = json_values(args.records, pii=False)
    sizes = [len(v) for v in pii]
    print(
        f"{args.records} records of {min(sizes)}-{max(sizes)} bytes, batches of {args.batch}, "
        f"median of {args.rounds} rounds"
    )
    variants = [
        ("pii-mask/pii", "builtin:pii-mask", {}, pii),
        ("pii-mask/clean", "builtin:pii-mask", {}, clean),
        ("pii-mask/fields", "builtin:pii-mask", {"fields": ["email", "card"]}, pii),
        ("json-validate", "builtin:json-validate", {"required_fields": ["user_id"]}, pii),
    ]
    print(f"{'variant':18} {'records/s':>12} {'us/record':>10} {'rewritten':>10}")
    for name, module, config, values in variants:
        f = load_filter(FilterSpec(name=name.replace("/", "-"), module=module, config=config))
        rate, rewritten = measure(f, values, args.batch, args.rounds)
        f.close()
        print(f"{name:18} {rate:12,.0f} {1e6 / rate:10.2f} {rewritten:10}")


if __name__ == "__main__":
    main()
