"""Profile the proxy under the benchmark workloads with py-spy (sampling, no code changes).

    python -m bench.profile_proxy [--variant mask-produce|mask-fetch|sluice|encrypt-produce|
                                   encrypt-fetch|encrypt-fields-produce|encrypt-fields-fetch]
                                  [--records N] [--workload 1|2]

Starts Tansu and `sluice serve` with the variant's config, attaches `py-spy record` to the
proxy process while the produce (or, for the *-fetch variants, the consume) workload
runs, and prints the functions with the most samples, by own time and by inclusive time. The
encrypt variants use bench_proxy's builtin:encrypt configs (whole value, or the "card" field
for encrypt-fields-*; a local keyring in a temporary directory); their fetch variants produce
the records through the proxy first, so they are sealed.
Needs py-spy==0.4.3 and root (ptrace) or a permissive ptrace_scope.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import bench_proxy, latency, rig, targets, workload
from tests.harness.broker import TansuBroker


def summarise(collapsed: Path, top: int) -> str:
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        total += count
        frames = stack.split(";")
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    out = [f"{total} samples", "", "own time:"]
    out += [f"  {100 * n / total:5.1f}%  {name}" for name, n in own.most_common(top)]
    out += ["", "inclusive:"]
    out += [f"  {100 * n / total:5.1f}%  {name}" for name, n in inclusive.most_common(top)]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--variant", default="mask-produce")
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    ap.add_argument(
        "--latency", action="store_true", help="profile the fixed-rate latency workload instead"
    )
    ap.add_argument("--native", action="store_true", help="include native (C) frames")
    ap.add_argument("--workload", type=int, choices=(1, 2), default=None,
                    help="compression and partitions of bench_proxy's workload 1 or 2 "
                         "(default: lz4, 3 partitions)")
    args = ap.parse_args(argv)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    configs = {
        "sluice": None,
        "mask-produce": rig.MASK_PRODUCE,
        "mask-fetch": rig.MASK_FETCH,
    }
    values = workload.json_records(args.records)
    out = Path(tempfile.mkdtemp(prefix="sluice-prof-")) / f"{args.variant}.txt"
    if args.variant.startswith("encrypt-"):
        template = (rig.ENCRYPT_FIELDS if args.variant.startswith("encrypt-fields-")
                    else rig.ENCRYPT)
        configs[args.variant] = template.format(path=json.dumps(str(out.parent / "keys.json")))
    fetching = args.variant in ("mask-fetch", "encrypt-fetch", "encrypt-fields-fetch")
    with TansuBroker() as broker, targets.sluice(broker.bootstrap, configs[args.variant]) as t:
        w = bench_proxy.WORKLOADS.get(args.workload or 0)
        topic = workload.make_topic(t.bootstrap, **({"partitions": w.partitions} if w else {}))
        compression = w.compression if w else "lz4"  # workload.produce's default
        if fetching:
            # Encrypted records must be sealed by the proxy; masked ones are stored plain.
            source = t.bootstrap if args.variant.startswith("encrypt-") else broker.bootstrap
            workload.produce(source, topic, values, compression)
        spy = subprocess.Popen(
            [
                py_spy,
                "record",
                "--pid",
                str(t.pid),
                "--rate",
                str(args.rate),
                "--format",
                "raw",
                "--output",
                str(out),
                # --native cannot sample without pausing the process.
                *(["--native"] if args.native else ["--nonblocking"]),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            if args.latency:
                producer = latency.latency_producer(t.bootstrap)
                producer.list_topics(topic, timeout=10)
                latency.produce_at_rate(producer, topic, 2000, 10, time.time())
            elif fetching:
                workload.consume(t.bootstrap, topic, args.records)
            else:
                workload.produce(t.bootstrap, topic, values, compression)
        finally:
            spy.send_signal(subprocess.signal.SIGINT)  # type: ignore[attr-defined]
            spy.wait(30)
    print(f"collapsed stacks: {out}")
    print(summarise(out, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
