"""What bench.scaling compares and where it runs it: the proxy layouts (CPUs the proxy may use,
`--workers`, `proxy.filter_threads`) and the CPU sets of the proxy and of everything else.

Pure: no process is started or pinned here (bench.scaling does that), so the planning can be
tested on any machine.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from dataclasses import dataclass

#: `proxy.filter_threads` when the config does not set it (proxy/ops/config.py).
DEFAULT_FILTER_THREADS = 2


@dataclass(frozen=True)
class Layout:
    """One way to run the proxy: how many CPUs it may use, its workers and filter threads."""

    name: str
    cpus: int
    workers: int = 1
    filter_threads: int = DEFAULT_FILTER_THREADS

    def proxy_args(self) -> list[str]:
        """The `sluice serve` arguments of this layout."""
        return ["--workers", str(self.workers)] if self.workers > 1 else []

    def proxy_yaml(self) -> str:
        """Config text appended to every variant's config for this layout ('' for defaults)."""
        if self.filter_threads == DEFAULT_FILTER_THREADS:
            return ""
        return f"proxy:\n  filter_threads: {self.filter_threads}\n"

    def describe(self) -> str:
        return (f"{self.cpus} CPU{'s' if self.cpus > 1 else ''}, {self.workers} "
                f"worker{'s' if self.workers > 1 else ''}, filter_threads {self.filter_threads}")


LAYOUTS = {
    layout.name: layout
    for layout in (
        Layout("1cpu", 1),
        Layout("2cpu", 2),
        Layout("2cpu-w2", 2, workers=2),
        # Not in the default set: the filters on the event loop, no thread pool.
        Layout("1cpu-t0", 1, filter_threads=0),
        Layout("2cpu-t4", 2, filter_threads=4),
    )
}
DEFAULT_LAYOUTS = ("1cpu", "2cpu", "2cpu-w2")
#: The layout whose CPU s/GB the sizing uses: the proxy alone on one CPU of its own.
BASIS = "1cpu"


class PlanError(ValueError):
    """A layout or CPU set that cannot be run on this machine; the message says why."""


def parse_layouts(text: str) -> list[Layout]:
    """Comma-separated layout names, in order, without repeats; BASIS first (added if missing),
    because every other layout is compared with it."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in LAYOUTS]
    if unknown:
        raise PlanError(f"unknown layouts: {', '.join(unknown)} (known: {', '.join(LAYOUTS)})")
    ordered = [BASIS] + [n for n in dict.fromkeys(names) if n != BASIS]
    return [LAYOUTS[n] for n in ordered]


@dataclass(frozen=True)
class CpuPlan:
    """The CPUs of the clients and brokers (`rest`) and of the proxy in each layout."""

    rest: frozenset[int]
    proxy: dict[str, frozenset[int]]

    def shares(self, layout: str) -> bool:
        """Whether the proxy in `layout` may run on a CPU of the clients and brokers."""
        return bool(self.proxy[layout] & self.rest)

    @staticmethod
    def text(cpus: Set[int]) -> str:
        """A CPU set as taskset writes it: runs of numbers as ranges."""
        out: list[str] = []
        for cpu in sorted(cpus):
            if out and out[-1].split("-")[-1] == str(cpu - 1):
                out[-1] = f"{out[-1].split('-')[0]}-{cpu}"
            else:
                out.append(str(cpu))
        return ",".join(out)


def plan(allowed: Set[int], layouts: Sequence[Layout], rest: Set[int] | None = None) -> CpuPlan:
    """Place the proxy of every layout on CPUs of its own first (those not in `rest`), and
    only when there are too few on the CPUs of the clients and brokers as well.

    `allowed`: the CPUs this process may use; `rest`: the clients' and brokers' CPUs (default:
    the lowest allowed one). At least two CPUs are needed, one for the proxy alone."""
    if len(allowed) < 2:
        raise PlanError(
            f"needs at least 2 CPUs, one of them for the proxy alone; this process may use "
            f"{len(allowed)} ({CpuPlan.text(allowed) or 'none'})"
        )
    rest = set(rest) if rest else {min(allowed)}
    if not rest <= allowed:
        raise PlanError(
            f"--cpus-rest {CpuPlan.text(rest)}: CPU {min(rest - allowed)} is not one this "
            f"process may use ({CpuPlan.text(allowed)})"
        )
    own = sorted(allowed - rest)
    if not own:
        raise PlanError(
            f"--cpus-rest {CpuPlan.text(rest)} takes every CPU; leave at least one for the proxy"
        )
    shared = sorted(rest)
    proxy: dict[str, frozenset[int]] = {}
    for layout in layouts:
        if layout.cpus > len(allowed):
            raise PlanError(
                f"layout {layout.name} needs {layout.cpus} CPUs; this process may use "
                f"{len(allowed)} ({CpuPlan.text(allowed)})"
            )
        if layout.cpus < 1 or layout.workers < 1 or layout.filter_threads < 0:
            raise PlanError(f"layout {layout.name}: cpus and workers must be at least 1, "
                            "filter_threads at least 0")
        picked = own[: layout.cpus]
        picked += shared[: layout.cpus - len(picked)]
        proxy[layout.name] = frozenset(picked)
    return CpuPlan(frozenset(rest), proxy)
