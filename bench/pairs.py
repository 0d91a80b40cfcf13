"""Statistics over interleaved slices: every variant is measured once per slice, next to the
`direct` measurement of the same slice, and reported as the median of those per-slice ratios
(or differences) with their spread.

Why pairs: on a shared 2-core machine the speed of everything drifts by tens of percent over a
minute. A ratio taken inside one short slice sees the same drift on both sides; the median over
slices then drops the slices a burst of other work hit.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Summary:
    """The median of per-slice values and their range."""

    median: float
    low: float
    high: float
    n: int

    def ratio_text(self) -> str:
        if not self.n:
            return "-"
        spread = f" ({self.low:.2f}..{self.high:.2f})" if self.n > 1 else ""
        return f"{self.median:.2f}{spread}"

    def added_text(self) -> str:
        if not self.n:
            return "-"
        spread = f" ({self.low:+.2f}..{self.high:+.2f})" if self.n > 1 else ""
        return f"{self.median:+.2f}{spread}"


EMPTY = Summary(math.nan, math.nan, math.nan, 0)


def summarise(values: Sequence[float]) -> Summary:
    """Median, lowest and highest of `values` (EMPTY when there are none)."""
    if not values:
        return EMPTY
    return Summary(statistics.median(values), min(values), max(values), len(values))


def ratios(values: Sequence[float | None], reference: Sequence[float | None]) -> list[float]:
    """Per-slice ratios value / reference, over the slices where both were measured."""
    return [
        v / r
        for v, r in zip(values, reference, strict=True)
        if v is not None and r is not None and r > 0
    ]


def differences(values: Sequence[float | None], reference: Sequence[float | None]) -> list[float]:
    """Per-slice differences value - reference, over the slices where both were measured."""
    return [
        v - r for v, r in zip(values, reference, strict=True) if v is not None and r is not None
    ]


def median(values: Sequence[float | None]) -> float:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else math.nan


def rotation(names: Sequence[str], slice_index: int) -> list[str]:
    """The order the variants run in during one slice: rotated by one each slice, so that no
    variant always follows the same one (a variant that heats the machine would otherwise
    always slow the same neighbour)."""
    k = slice_index % len(names) if names else 0
    return [*names[k:], *names[:k]]
