"""Throughput through Sluice versus directly to the broker, measured side by side.

    python -m bench.bench_proxy [--records N] [--rounds R] [--variants direct,sluice,...]

Each round runs every variant once in turn (so slow drifts of a noisy machine hit all alike);
the table reports the median records/s and the ratio to direct. Variants: direct, relay
(HAProxy in TCP mode), sluice (no filters), mask-produce and mask-fetch (builtin:pii-mask).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

from bench import targets, workload
from tests.harness.broker import TansuBroker

MASK_PRODUCE = """
filters:
  - name: mask-pii
    module: builtin:pii-mask
    topics: ["bench-*"]
    apply_to: [produce]
"""
MASK_FETCH = MASK_PRODUCE.replace("[produce]", "[fetch]")

Variant = Callable[[str], AbstractContextManager[str]]


def variants() -> dict[str, Variant]:
    out: dict[str, Variant] = {
        "direct": targets.direct,
        "sluice": lambda b: targets.sluice(b),
        "mask-produce": lambda b: targets.sluice(b, MASK_PRODUCE),
        "mask-fetch": lambda b: targets.sluice(b, MASK_FETCH),
    }
    if targets.haproxy_available():
        out["relay"] = targets.haproxy_relay
    return out


@contextlib.contextmanager
def broker_for(variant: str) -> Iterator[TansuBroker]:
    with TansuBroker() as broker:
        yield broker


def run(
    records: int, rounds: int, names: list[str], compression: str
) -> dict[str, dict[str, list[float]]]:
    values = workload.json_records(records)
    table: dict[str, dict[str, list[float]]] = {n: {"produce": [], "consume": []} for n in names}
    all_variants = variants()
    for r in range(rounds):
        for name in names:
            with TansuBroker() as broker, all_variants[name](broker.bootstrap) as bootstrap:
                topic = workload.make_topic(bootstrap)
                p = workload.produce(bootstrap, topic, values, compression)
                c = workload.consume(bootstrap, topic, records)
                table[name]["produce"].append(records / p)
                table[name]["consume"].append(records / c)
                print(
                    f"  round {r + 1} {name:13s} produce {records / p:10.0f} rec/s"
                    f"  consume {records / c:10.0f} rec/s",
                    file=sys.stderr,
                )
    return table


def report(table: dict[str, dict[str, list[float]]]) -> str:
    base_p = statistics.median(table["direct"]["produce"])
    base_c = statistics.median(table["direct"]["consume"])
    lines = [
        f"{'variant':14s} {'produce rec/s':>14s} {'ratio':>6s}"
        f" {'consume rec/s':>14s} {'ratio':>6s}",
    ]
    for name, row in table.items():
        p = statistics.median(row["produce"])
        c = statistics.median(row["consume"])
        lines.append(f"{name:14s} {p:14.0f} {p / base_p:6.2f} {c:14.0f} {c / base_c:6.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default="direct,sluice")
    ap.add_argument("--compression", default="lz4")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    if "direct" not in names:
        names.insert(0, "direct")
    unknown = set(names) - set(variants())
    if unknown:
        ap.error(f"unknown variants: {', '.join(sorted(unknown))}")
    table = run(args.records, args.rounds, names, args.compression)
    print(
        f"records={args.records} x ~200-byte JSON, compression={args.compression},"
        f" rounds={args.rounds} (medians)"
    )
    print(report(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
