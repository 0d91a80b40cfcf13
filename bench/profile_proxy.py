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
`--threads` samples idle threads too and splits the samples per thread (py-spy's
`--threads --idle`): how much of the run each filter thread worked, and what it waited on.
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

#: Where a thread that does nothing is found (py-spy --idle): the pool's wait for work, a
#: condition or lock wait, the event loop's poll (uvloop polls in C: the innermost Python
#: frame is `Runner.run`), the epoch ticker's sleep.
_IDLE_FRAMES = ("_worker (concurrent/futures/thread.py", "wait (threading.py",
                "get (queue.py", "select (selectors.py", "run_forever", "Runner.run (",
                "FilterEngine._tick (")


def summarise(collapsed: Path, top: int) -> str:
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    # thread -> (samples, where its idle samples were)
    threads: dict[str, tuple[int, collections.Counter[str]]] = {}
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(";")
        if frames[0].startswith("process "):
            frames = frames[1:]
        if frames and frames[0].startswith("thread "):
            name = frames[0]
            frames = frames[1:] or [name]
            n, idle = threads.get(name, (0, collections.Counter()))
            if frames[-1].startswith(_IDLE_FRAMES) or "idle" in frames[-1]:
                idle[frames[-1].split(" (")[0]] += count
            threads[name] = (n + count, idle)
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    out = [f"{total} samples", "", "own time:"]
    if threads:
        out[1:1] = ["", "per thread (share of its samples that were idle, and where):"]
        for thread, (n, idle) in sorted(threads.items(), key=lambda kv: -kv[1][0]):
            waits = ", ".join(f"{name} {100 * k / n:.0f}%" for name, k in idle.most_common(3))
            out.insert(-1, f"  {thread}: {n} samples, idle {100 * sum(idle.values()) / n:.0f}%"
                       + (f" ({waits})" if waits else ""))
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
    ap.add_argument("--proxy-yaml", default="",
                    help="appended to the variant's config (e.g. 'proxy: {spread_produce: false}')")
    ap.add_argument("--threads", action="store_true",
                    help="sample idle threads too and split the samples per thread")
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
    config = configs[args.variant]
    if args.proxy_yaml:
        config = (config or "") + "\n" + args.proxy_yaml + "\n"
    with TansuBroker() as broker, targets.sluice(broker.bootstrap, config) as t:
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
                *(["--threads", "--idle"] if args.threads else []),
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
