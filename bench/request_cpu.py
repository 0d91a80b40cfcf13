"""CPU per request of the proxy in the middle: one-record Produce requests at a fixed rate.

Measures what the core costs per request and response: the proxy runs with no filter (or with
`--mask`: builtin:pii-mask on produce, the mask-produce variant), a producer sends one record
per request (linger.ms=0, acks=1) at a fixed rate, and the proxy process's CPU time (user +
system, from psutil) is divided by the records sent.
Variants run in interleaved slices on one broker, so machine drift hits them alike:

- `this`: `sluice serve` of this checkout;
- `other`: `sluice serve` run by another installation's Python (`--other PYTHON`), or of
  another source tree of Sluice with this checkout's Python and packages (`--baseline DIR`,
  bench/baseline.py), for a before/after comparison of two builds in the same run.

    .venv/bin/python -m bench.request_cpu --seconds 5 --slices 5 [--mask]
        [--other PYTHON | --baseline DIR]

Prints one line per slice (with the split between the event loop's thread and the others:
the filter pool, the Wasm epoch ticker; and how often per request the loop's thread was
preempted) and a summary (median CPU µs per request per variant).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from confluent_kafka import Producer

from bench import baseline
from bench.workload import QUIET, json_records
from sluice.local_broker import TansuBroker


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


MASK_CONFIG = """\
filters:
  - name: pii
    module: builtin:pii-mask
    topics: ["cpu-*"]
    apply_to: [produce]
"""


class Proxy:
    def __init__(self, python: str, upstream: str, config: str | None = None,
                 source: baseline.Source | None = None) -> None:
        self.port = _free_port()
        self.process = subprocess.Popen(
            [python, "-m", "sluice", "serve", "--listen", f"127.0.0.1:{self.port}",
             "--upstream", upstream, *(["--config", config] if config else [])],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONWARNINGS": "ignore", **(source.env if source else {})},
            # Not the checkout: its `sluice/` folder would shadow another installation's
            # (a baseline tree's shim directory is where its `sluice` package is found).
            cwd=source.cwd if source else tempfile.gettempdir(),
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            self.stop()
            raise RuntimeError(f"{python} -m sluice serve did not start")
        self.ps = psutil.Process(self.process.pid)

    def cpu(self) -> float:
        t = self.ps.cpu_times()
        return float(t.user + t.system)

    def split(self) -> tuple[float, int]:
        """CPU seconds of the event loop's thread (the main one) and its involuntary context
        switches so far (from /proc: the loop preempted, e.g. waiting for the GIL or a core)."""
        pid = self.process.pid
        loop = next((t for t in self.ps.threads() if t.id == pid), None)
        seconds = float(loop.user_time + loop.system_time) if loop is not None else 0.0
        switches = 0
        with open(f"/proc/{pid}/task/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("nonvoluntary_ctxt_switches:"):
                    switches = int(line.split()[1])
        return seconds, switches

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def one_slice(producer: Producer, topic: str, values: list[bytes], rate: int) -> int:
    start = time.perf_counter()
    for i, value in enumerate(values):
        due = start + i / rate
        while (now := time.perf_counter()) < due:
            producer.poll(max(0.0, min(due - now, 0.001)))
        producer.produce(topic, value)
        producer.poll(0)
    producer.flush(30)
    return len(values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per slice and variant")
    parser.add_argument("--slices", type=int, default=5)
    parser.add_argument("--rate", type=int, default=2000, help="requests per second")
    parser.add_argument("--other", help="another installation's python, run side by side")
    parser.add_argument("--baseline", metavar="DIR",
                        help="another Sluice source tree, run side by side (bench/baseline.py)")
    parser.add_argument("--mask", action="store_true", help="builtin:pii-mask on produce")
    args = parser.parse_args(argv)
    if args.other and args.baseline:
        parser.error("--other and --baseline both name the other side: give one")
    source = baseline.prepare(Path(args.baseline)) if args.baseline else None
    n = int(args.seconds * args.rate)
    values = json_records(n)
    with TansuBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        config = None
        if args.mask:
            config = os.path.join(tmp, "mask.yaml")
            with open(config, "w", encoding="utf-8") as f:
                f.write(MASK_CONFIG)
        proxies: dict[str, Proxy] = {"this": Proxy(sys.executable, broker.bootstrap, config)}
        if args.other or source is not None:
            proxies["other"] = Proxy(args.other or sys.executable, broker.bootstrap, config,
                                     source)
        producers: dict[str, Producer] = {}
        try:
            for name, proxy in proxies.items():
                producers[name] = Producer(
                    {"bootstrap.servers": f"127.0.0.1:{proxy.port}", "linger.ms": 0,
                     "acks": 1, **QUIET}
                )
                one_slice(producers[name], f"cpu-{name}", values[:200], args.rate)  # warm up
            results: dict[str, list[float]] = {name: [] for name in proxies}
            order = list(proxies)
            for k in range(args.slices):
                for name in order if k % 2 == 0 else reversed(order):
                    before = proxies[name].cpu()
                    loop_before, switches_before = proxies[name].split()
                    sent = one_slice(producers[name], f"cpu-{name}", values, args.rate)
                    micros = (proxies[name].cpu() - before) / sent * 1e6
                    loop_after, switches_after = proxies[name].split()
                    loop_us = (loop_after - loop_before) / sent * 1e6
                    results[name].append(micros)
                    print(f"slice {k} {name}: {micros:.1f} CPU µs per request ({sent} requests;"
                          f" loop thread {loop_us:.1f}, other threads {micros - loop_us:.1f};"
                          f" loop preempted {(switches_after - switches_before) / sent:.2f}"
                          " times per request)")
            print(f"one-record produce requests at {args.rate}/s"
                  f"{' with pii-mask' if args.mask else ''}, {args.slices} slices of "
                  f"{args.seconds:g} s; proxy CPU µs per request and response:")
            for name, values_us in results.items():
                print(f"  {name:6s} median {statistics.median(values_us):6.1f}  "
                      f"min {min(values_us):6.1f}  max {max(values_us):6.1f}")
            if "other" in results:
                ratio: Any = statistics.median(
                    t / o for t, o in zip(results["this"], results["other"], strict=True)
                )
                print(f"  this/other, median of per-slice ratios: {ratio:.3f}")
        finally:
            for proxy in proxies.values():
                proxy.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
