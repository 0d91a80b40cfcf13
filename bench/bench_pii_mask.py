"""Per-record cost of builtin:pii-mask through the host runtime (no broker, no network).

    python -m bench.bench_pii_mask [--records 20000] [--batch 100] [--rounds 5] [--profile]
                                   [--module PATH.wasm] [--variants pii,clean,...]

Records are ~200-byte JSON values (as bench.bench_proxy sends), in batches of 100, measured
two ways:

- decoding path: ``LoadedFilter.run_batch`` over decoded records (``sluice_filter``: the ABI
  encoding, the Wasm call and the decoding of decisions);
- native path: ``filter_produce`` over an uncompressed record batch (what the proxy calls per
  partition: CRC check, ``sluice_filter_records`` on the records section, the codec's check
  of the result, the rebuilt batch), and ``filter_fetch`` over the same batch (the fetch
  direction's per-partition call). Minus the guest column, these are the host's share.

Variants:

  pii-mask/pii      every record holds an e-mail address, every third a card number
  pii-mask/clean    the same shape without personal data (nothing to rewrite)
  pii-mask/workload bench.bench_proxy's records: an e-mail address and a card number in each
  pii-mask/fields   pii records, with field paths configured as well
  pii-mask/keyed    pii records with a short key and two short header values (one a trace
                    id), all three scanned as the defaults do
  pii-mask/keyed-values  the same records with ``keys: false, headers: false``
  pii-mask/text-1k  ~1 KB log lines (not JSON: text mode), each with one e-mail address and
                    one card number in the middle of ordinary words
  pii-mask/text-1k-clean  the same lines without them
  json-validate     a cheap builtin over the same records: the host's fixed cost per batch

Prints µs/record (median of the rounds, thread CPU time) per variant and path, and the guest
call alone (``sluice_filter_records`` on the records section, without the host's checks), also
as ns per byte of record value. ``--module`` runs another build of pii-mask (a .wasm path) in
place of the builtin, to compare two builds with one command.
``--against OLD.wasm`` instead times the guest call of two builds in one process, their rounds
alternating (on a loaded machine, runs of the command one after the other differ by more than
a guest change does), and prints both with their ratio.
``--profile`` instead runs cProfile over the native path of pii-mask/pii and prints where the
time goes (the guest call against the host's checks), per record.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

from bench.workload import json_records as workload_records
from sluice.codec.records import HEADER_SIZE, BatchHeader, Record, build_batch
from sluice.filters.chain import FilterChain
from sluice.filters.config import FilterSpec
from sluice.filters.context import FilterRecord, RecordContext
from sluice.filters.pipeline import filter_fetch, filter_produce
from sluice.filters.runtime import LoadedFilter


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


def text_values(n: int, pii: bool, size: int = 1000, seed: int = 11) -> list[bytes]:
    """Log lines of about `size` bytes, with an e-mail address and a card number in the middle
    of ordinary words (or, without pii, the same words)."""
    rng = random.Random(seed)
    words = ["request", "served", "in", "ms", "status", "ok", "user", "session", "opened",
             "from", "the", "web", "client", "cache", "miss", "retry", "queue", "latency"]
    out = []
    for i in range(n):
        line: list[str] = [f"2026-11-28T06:{i % 60:02d}:00Z INFO"]
        while sum(len(w) + 1 for w in line) < size // 2:
            line.append(rng.choice(words))
        line.append(f"contact user{i}@example.com card 4111 1111 1111 1111" if pii
                    else "contact user at example card on file")
        while sum(len(w) + 1 for w in line) < size:
            line.append(rng.choice(words))
        out.append(" ".join(line).encode())
    return out


CTX = RecordContext(topic="bench", partition=0, direction="produce", client_id="bench")
FETCH_CTX = RecordContext(topic="bench", partition=0, direction="fetch", client_id="bench")
TRACE_ID = b"4bf92f3577b34da6a3ce929d0e0e4736"


def key_and_headers(i: int, keyed: bool) -> tuple[bytes | None, list[tuple[str, bytes | None]]]:
    """The key and headers of record i: none, or a short key and two short header values."""
    if not keyed:
        return None, []
    return f"user-{i}".encode(), [("trace-id", TRACE_ID), ("source", b"web")]


def _median_us(run: list[Any], n_records: int, rounds: int) -> float:
    for item in run[:10]:  # warm-up
        item()
    per_record = []
    for _ in range(rounds):
        start = time.thread_time()
        for item in run:
            item()
        per_record.append((time.thread_time() - start) / n_records * 1e6)
    return statistics.median(per_record)


def measure_decoding(f: LoadedFilter, values: list[bytes], batch: int, rounds: int,
                     keyed: bool = False) -> float:
    def record(i: int, j: int, value: bytes) -> FilterRecord:
        key, headers = key_and_headers(i + j, keyed)
        return FilterRecord(j, 0, key, value, headers)

    batches = [
        [record(i, j, v) for j, v in enumerate(values[i : i + batch])]
        for i in range(0, len(values), batch)
    ]
    return _median_us([lambda b=b: f.run_batch(CTX, b) for b in batches], len(values), rounds)


def measure_native(chain: FilterChain, values: list[bytes], batch: int, rounds: int,
                   keyed: bool = False, fetch: bool = False) -> float:
    """filter_produce (or, with `fetch`, filter_fetch) over uncompressed batches."""
    assert chain.native_for(CTX.topic, "produce"), "the module has no sluice_filter_records"
    raw = []
    for i in range(0, len(values), batch):
        records = []
        for j, v in enumerate(values[i : i + batch]):
            key, headers = key_and_headers(i + j, keyed)
            records.append(Record(j, 0, key, v, headers))
        n = len(records)
        header = BatchHeader(0, 0, -1, 2, 0, 0, n - 1, 0, 0, -1, -1, -1, n)
        raw.append(build_batch(header, records))
    if fetch:
        return _median_us([lambda r=r: filter_fetch(chain, FETCH_CTX, r) for r in raw],
                          len(values), rounds)
    return _median_us([lambda r=r: filter_produce(chain, CTX, r) for r in raw], len(values),
                      rounds)


def guest_sections(values: list[bytes], batch: int,
                   keyed: bool = False) -> list[tuple[memoryview, int]]:
    """Each batch's records section (what the guest call takes) and its record count."""
    sections = []
    for i in range(0, len(values), batch):
        records = []
        for j, v in enumerate(values[i : i + batch]):
            key, headers = key_and_headers(i + j, keyed)
            records.append(Record(j, 0, key, v, headers))
        n = len(records)
        data = build_batch(BatchHeader(0, 0, -1, 2, 0, 0, n - 1, 0, 0, -1, -1, -1, n), records)
        sections.append((memoryview(data)[HEADER_SIZE:], n))
    return sections


def measure_guest(f: LoadedFilter, values: list[bytes], batch: int, rounds: int,
                  keyed: bool = False) -> float:
    """The guest call of the native path alone, on each batch's records section."""
    sections = guest_sections(values, batch, keyed)
    return _median_us([lambda s=s, n=n: f.run_native(CTX, s, n) for s, n in sections],
                      len(values), rounds)


def measure_guest_pair(a: LoadedFilter, b: LoadedFilter, values: list[bytes], batch: int,
                       rounds: int, keyed: bool = False) -> tuple[float, float]:
    """measure_guest for two builds, their rounds alternating: the medians (µs/record)."""
    sections = guest_sections(values, batch, keyed)
    for f in (a, b):  # warm-up
        for s, n in sections[:10]:
            f.run_native(CTX, s, n)
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(rounds):
        for f, out in ((a, times[0]), (b, times[1])):
            start = time.thread_time()
            for s, n in sections:
                f.run_native(CTX, s, n)
            out.append((time.thread_time() - start) / len(values) * 1e6)
    return statistics.median(times[0]), statistics.median(times[1])


def profile_native(values: list[bytes], batch: int, rounds: int) -> None:
    """cProfile of pii-mask's native path: the top functions by own time, in µs per record."""
    import cProfile
    import pstats

    spec = FilterSpec(name="pii-mask", module="builtin:pii-mask", config={},
                      topics=("bench",), apply_to=frozenset({"produce"}))
    chain = FilterChain.from_specs([spec])
    raw = []
    for i in range(0, len(values), batch):
        records = [Record(j, 0, None, v, []) for j, v in enumerate(values[i : i + batch])]
        n = len(records)
        raw.append(build_batch(BatchHeader(0, 0, -1, 2, 0, 0, n - 1, 0, 0, -1, -1, -1, n),
                               records))
    for r in raw:  # warm: compiled module, caches
        filter_produce(chain, CTX, r)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(rounds):
        for r in raw:
            filter_produce(chain, CTX, r)
    prof.disable()
    chain.close()
    total = len(values) * rounds
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    rows = sorted(((tt, f"{fn[0].rsplit('/', 1)[-1]}:{fn[1]}({fn[2]})")
                   for fn, (_cc, _nc, tt, _ct, _callers) in stats.items()), reverse=True)
    whole = sum(tt for tt, _ in rows)
    print(f"pii-mask native path, batches of {batch}: {whole / total * 1e6:.2f} µs/record "
          "(profiled)")
    for tt, name in rows[:8]:
        print(f"  {tt / total * 1e6:6.3f} µs/record  {name}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", action="store_true",
                        help="profile pii-mask's native path instead of timing variants")
    parser.add_argument("--module", default="builtin:pii-mask",
                        help="the pii-mask build to measure (a .wasm path; default the builtin)")
    parser.add_argument("--against", default="",
                        help="another pii-mask build (a .wasm path): time the guest call of "
                        "both, rounds alternating, and print their ratio")
    parser.add_argument("--variants", default="",
                        help="comma-separated variant names (default: all)")
    args = parser.parse_args(argv)
    pii = json_values(args.records, pii=True)
    if args.profile:
        profile_native(pii, args.batch, args.rounds)
        return
    clean = json_values(args.records, pii=False)
    sizes = [len(v) for v in pii]
    print(
        f"{args.records} records of {min(sizes)}-{max(sizes)} bytes, batches of {args.batch}, "
        f"median of {args.rounds} rounds"
    )
    off = {"keys": False, "headers": False}
    mask = args.module
    text_n = max(1, args.records // 5)
    variants: list[tuple[str, str, dict[str, Any], list[bytes], bool]] = [
        ("pii-mask/pii", mask, {}, pii, False),
        ("pii-mask/workload", mask, {}, workload_records(args.records), False),
        ("pii-mask/clean", mask, {}, clean, False),
        ("pii-mask/fields", mask, {"fields": ["email", "card"]}, pii, False),
        ("pii-mask/keyed", mask, {}, pii, True),
        ("pii-mask/keyed-values", mask, off, pii, True),
        ("pii-mask/text-1k", mask, {}, text_values(text_n, pii=True), False),
        ("pii-mask/text-1k-clean", mask, {}, text_values(text_n, pii=False), False),
        ("json-validate", "builtin:json-validate", {"required_fields": ["user_id"]}, pii, False),
    ]
    if args.variants:
        chosen = set(args.variants.split(","))
        variants = [v for v in variants if v[0] in chosen or v[0].split("/")[-1] in chosen]
    if args.against:
        compare(variants, args.against, args.batch, args.rounds)
        return
    print(f"{'variant':22} {'decoding us/rec':>16} {'native us/rec':>14} {'fetch us/rec':>13} "
          f"{'guest us/rec':>13} {'guest ns/byte':>14}")
    for name, module, config, values, keyed in variants:
        spec = FilterSpec(name=name.replace("/", "-"), module=module, config=config,
                          topics=("bench",), apply_to=frozenset({"produce", "fetch"}))
        chain = FilterChain.from_specs([spec])
        decoding = measure_decoding(chain.filters[0], values, args.batch, args.rounds, keyed)
        native = measure_native(chain, values, args.batch, args.rounds, keyed)
        fetch = measure_native(chain, values, args.batch, args.rounds, keyed, fetch=True)
        guest = measure_guest(chain.filters[0], values, args.batch, args.rounds, keyed)
        chain.close()
        per_byte = guest * 1000 * len(values) / sum(len(v) for v in values)
        print(f"{name:22} {decoding:16.2f} {native:14.2f} {fetch:13.2f} {guest:13.2f} "
              f"{per_byte:14.2f}")


def compare(variants: list[tuple[str, str, dict[str, Any], list[bytes], bool]], against: str,
            batch: int, rounds: int) -> None:
    """The guest call of each pii-mask variant under --module and under `against`."""
    print(f"guest call, rounds alternating: A = --module, B = {against}")
    print(f"{'variant':22} {'A us/rec':>9} {'A ns/byte':>10} {'B us/rec':>9} {'B ns/byte':>10} "
          f"{'A / B':>6}")
    for name, module, config, values, keyed in variants:
        if not name.startswith("pii-mask/"):
            continue
        chains = [
            FilterChain.from_specs([FilterSpec(
                name=name.replace("/", "-"), module=m, config=config, topics=("bench",),
                apply_to=frozenset({"produce", "fetch"}))])
            for m in (module, against)
        ]
        a, b = measure_guest_pair(chains[0].filters[0], chains[1].filters[0], values, batch,
                                  rounds, keyed)
        for chain in chains:
            chain.close()
        per_byte = 1000 * len(values) / sum(len(v) for v in values)
        print(f"{name:22} {a:9.3f} {a * per_byte:10.2f} {b:9.3f} {b * per_byte:10.2f} "
              f"{a / b:6.2f}")


if __name__ == "__main__":
    main()
