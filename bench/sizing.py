"""Sizing a deployment from measured CPU seconds per GB: the arithmetic of bench.scaling.

What carries over from a benchmark machine to a deployment is the proxy's cost, not the
benchmark's throughput: a throughput depends on the client, the broker and the cores they
share, the proxy's CPU seconds per GB it carries much less. A proxy that spends C CPU seconds
per GB of a kind of traffic needs C cores for every GB/s of it (GB/s * s/GB = CPU s per s),
so the cores to give it are the sum over its kinds of traffic of rate * cost, over the share
of each core it may keep busy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

#: What to size for and where bench.scaling measures it: (kind, variant, phase). A phase's
#: cost is the proxy's CPU during that phase over the payload it carried in it.
KINDS = (
    ("passing through, produce", "sluice", "produce"),
    ("passing through, fetch", "sluice", "consume"),
    ("masked on produce (pii-mask)", "mask-produce", "produce"),
    ("masked on fetch (pii-mask)", "mask-fetch", "consume"),
    ("encrypted on produce", "encrypt", "produce"),
    ("decrypted on fetch", "encrypt", "consume"),
)
#: The share of a core to plan on keeping busy: room for bursts, GC and rebalances.
UTILISATION = 0.7


def cpu_s_per_gb(cpu_seconds: float, payload_bytes: float) -> float:
    """CPU seconds over GB (10^9 bytes) carried; NaN when nothing was carried."""
    return cpu_seconds / (payload_bytes / 1e9) if payload_bytes > 0 else math.nan


def cores_busy(cpu_seconds: float, wall_seconds: float) -> float:
    """How many cores a process kept busy on average over a span."""
    return cpu_seconds / wall_seconds if wall_seconds > 0 else math.nan


def cores_per_gb_s(cost: float) -> float:
    """Cores for 1 GB/s of traffic that costs `cost` CPU s/GB: numerically the same figure,
    kept as a function so that the unit is written once."""
    return cost


@dataclass(frozen=True)
class Need:
    """Cores for a mix of traffic: busy on average, and the whole cores to give the proxy."""

    busy: float
    cores: int


def cores_needed(
    rates: Mapping[str, float], costs: Mapping[str, float], utilisation: float = UTILISATION
) -> Need:
    """Cores for `rates` (GB/s of each kind) at `costs` (CPU s/GB of each kind), keeping each
    core at most `utilisation` busy. A kind with a rate but no cost is an error: sizing
    without its figure would be too low."""
    if not 0 < utilisation <= 1:
        raise ValueError(f"utilisation must be in (0, 1], got {utilisation}")
    busy = 0.0
    for kind, rate in rates.items():
        if rate < 0:
            raise ValueError(f"{kind}: a rate of {rate} GB/s")
        cost = costs.get(kind, math.nan)
        if rate and math.isnan(cost):
            raise ValueError(f"{kind}: no measured CPU s/GB")
        if rate:
            busy += rate * cores_per_gb_s(cost)
    # round() first: 0.7 / 0.7 is 1.0000000000000002 in floating point, one core, not two.
    return Need(busy, max(1, math.ceil(round(busy / utilisation, 9))))
