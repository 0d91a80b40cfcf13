"""The C SDK's own share of a native-path guest call, against another version of the header.

    python -m bench.bench_sdk_framing --against OLD/sluice_filter.h [--records 10000]
                                      [--batch 1000] [--rounds 15]

A filter's guest call is the host's part (input copied in, output read back), the SDK's
framing (records read, decisions counted, the output section written) and the filter's own
work. This builds three tiny C filters with the repository's header and with `--against`
(e.g. `git show main:filters/sdk/sluice_filter.h > /tmp/old.h`), and times their
``sluice_filter_records`` call on bench.bench_pii_mask's workload records, the two builds'
rounds alternating (the machine may be loaded):

  keep      keeps every record: reading and framing only (the output section is unchanged)
  rewrite   rewrites every value with a copy of itself: the output section written too
  mixed     rewrites every tenth record so: runs of kept records between rewrites

The difference to a build of the same filter is the SDK's; the filter's work is the same.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from bench.bench_pii_mask import measure_guest_pair
from bench.workload import json_records
from sluice.filters.build import build_filter
from sluice.filters.chain import FilterChain
from sluice.filters.config import FilterSpec

FILTERS = {
    "keep": "return sluice_keep();",
    "rewrite": "return sluice_rewrite_value(rec, sluice_copy(rec->value));",
    "mixed": ("if (rec->index % 10 != 3) return sluice_keep();\n"
              "    return sluice_rewrite_value(rec, sluice_copy(rec->value));"),
}


def build(name: str, header: Path | None, out_dir: Path) -> Path:
    """One of FILTERS, built with `header` beside it (the quoted include finds it first) or
    with the SDK's own."""
    src = out_dir / f"{name}-{'against' if header else 'sdk'}"
    src.mkdir()
    (src / "filter.c").write_text(
        '#include "sluice_filter.h"\n'
        "/* bench.bench_sdk_framing: the SDK's share of a guest call */\n"
        "sluice_decision sluice_on_record(const sluice_record *rec) {\n"
        f"    (void)rec;\n    {FILTERS[name]}\n}}\n")
    if header is not None:
        shutil.copyfile(header, src / "sluice_filter.h")
    return build_filter(src, src / "filter.wasm")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", type=Path, required=True,
                        help="another sluice_filter.h (e.g. main's) to build the filters with")
    parser.add_argument("--records", type=int, default=10000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    values = json_records(args.records)
    per_byte = 1000 * len(values) / sum(len(v) for v in values)
    print(f"{args.records} workload records, batches of {args.batch}, median of {args.rounds} "
          f"rounds; guest call, rounds alternating: A = this SDK, B = {args.against}")
    print(f"{'filter':10} {'A ns/rec':>9} {'A ns/byte':>10} {'B ns/rec':>9} {'B ns/byte':>10} "
          f"{'A / B':>6}")
    with tempfile.TemporaryDirectory(prefix="sluice-sdk-bench-") as tmp:
        for name in FILTERS:
            chains = [
                FilterChain.from_specs([FilterSpec(
                    name=f"sdk-{name}", module=str(build(name, header, Path(tmp))),
                    topics=("bench",), apply_to=frozenset({"produce", "fetch"}))])
                for header in (None, args.against)
            ]
            a, b = measure_guest_pair(chains[0].filters[0], chains[1].filters[0], values,
                                      args.batch, args.rounds)
            for chain in chains:
                chain.close()
            print(f"{name:10} {a * 1000:9.1f} {a * per_byte:10.3f} {b * 1000:9.1f} "
                  f"{b * per_byte:10.3f} {a / b:6.2f}")


if __name__ == "__main__":
    main()
