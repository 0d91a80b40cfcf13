"""Who holds another client's Metadata while one client pipelines Metadata and never reads?

Two phases, each with one flooding connection that writes Metadata requests as fast as the
socket takes them and reads nothing:

- ``via-proxy``: the flood goes through the proxy (the case of the core issue);
- ``direct``: the same flood straight to the broker, no proxy anywhere.

In both phases a prober times a fresh connection's Metadata every ``--interval`` seconds, once
through the proxy and once straight to the broker, in alternating order. If the slow answers
through the proxy come with equally slow direct answers, the broker (or the machine) holds
them; if only the proxy's are slow, the proxy does. Run:

    .venv/bin/python -m bench.metadata_starvation --tries 60

It prints, per phase and per probe path: tries, median, p99 and max milliseconds, and how many
took more than 1 s.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import statistics
import threading
import time
from collections.abc import Iterator

from bench.targets import sluice
from bench.wire import RawConnection, metadata_request, request_bytes
from sluice.local_broker import TansuBroker

METADATA_VERSION = 12


class Flooder(threading.Thread):
    """Writes Metadata requests on one connection, never reading, until stopped."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(daemon=True)
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.sock.settimeout(0.2)
        self.stop = threading.Event()
        self.sent = 0

    def run(self) -> None:
        entity = metadata_request(METADATA_VERSION, None)
        cid = 0
        pending = b""
        while not self.stop.is_set():
            if not pending:
                cid += 1
                pending = request_bytes(3, METADATA_VERSION, entity, cid & 0x7FFFFFFF)
            try:
                n = self.sock.send(pending)
            except TimeoutError:
                continue  # the peer stopped reading: back-pressure, keep trying
            except OSError:
                return
            pending = pending[n:]
            if not pending:
                self.sent += 1

    def close(self) -> None:
        self.stop.set()
        self.join(5)
        self.sock.close()


def timed_metadata(bootstrap: str) -> float:
    start = time.perf_counter()
    with contextlib.closing(RawConnection(bootstrap, timeout=30)) as conn:
        conn.call(3, METADATA_VERSION, metadata_request(METADATA_VERSION, []))
    return time.perf_counter() - start


@contextlib.contextmanager
def flooding(bootstrap: str) -> Iterator[Flooder]:
    flooder = Flooder(bootstrap)
    flooder.start()
    try:
        yield flooder
    finally:
        flooder.close()


def summary(name: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    slow = sum(1 for m in ms if m > 1000)
    return (
        f"  {name:<14} tries {len(ms):>3}  median {statistics.median(ms):7.1f} ms  "
        f"p99 {p99:7.1f} ms  max {ms[-1]:7.1f} ms  over 1 s: {slow}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=60, help="probes per phase and path")
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between probes")
    args = parser.parse_args(argv)
    with TansuBroker() as broker, sluice(broker.bootstrap) as proxy:
        for phase, flood_target in (("via-proxy", proxy.bootstrap), ("direct", broker.bootstrap)):
            probes: dict[str, list[float]] = {"through proxy": [], "direct": []}
            with flooding(flood_target) as flooder:
                time.sleep(1.0)  # let the flood fill the buffers first
                for i in range(args.tries):
                    order = [("through proxy", proxy.bootstrap), ("direct", broker.bootstrap)]
                    if i % 2:
                        order.reverse()
                    for name, bootstrap in order:
                        probes[name].append(timed_metadata(bootstrap))
                    time.sleep(args.interval)
                sent = flooder.sent
            print(f"flood {phase} ({sent} requests written, none read):")
            for name, seconds in probes.items():
                print(summary(name, seconds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
