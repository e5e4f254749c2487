"""Summaries of samples: min, median, p90, p99, max; and how two summaries compare."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


def percentile(ordered: Sequence[float], q: float) -> float:
    """The `q`-th percentile (0-100) of sorted samples, by linear interpolation."""
    if not ordered:
        return math.nan
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True, slots=True)
class Summary:
    """The distribution of one set of samples (same unit as the samples); NaNs are left out."""

    n: int
    min: float
    median: float
    p90: float
    p99: float
    max: float
    mean: float

    @classmethod
    def of(cls, samples: Iterable[float]) -> Summary:
        ordered = sorted(x for x in samples if not math.isnan(x))
        if not ordered:
            nan = math.nan
            return cls(0, nan, nan, nan, nan, nan, nan)
        return cls(
            n=len(ordered),
            min=ordered[0],
            median=percentile(ordered, 50),
            p90=percentile(ordered, 90),
            p99=percentile(ordered, 99),
            max=ordered[-1],
            mean=sum(ordered) / len(ordered),
        )

    def scaled(self, factor: float) -> Summary:
        """Every figure multiplied by `factor` (e.g. seconds → milliseconds)."""
        return Summary(
            self.n,
            self.min * factor,
            self.median * factor,
            self.p90 * factor,
            self.p99 * factor,
            self.max * factor,
            self.mean * factor,
        )


def ratio(value: float, base: float) -> float:
    """`value / base`, NaN when the base is zero or missing."""
    if not base or math.isnan(base) or math.isnan(value):
        return math.nan
    return value / base


@dataclass(frozen=True, slots=True)
class Noise:
    """One line's median against a reference line's, judged by how far either moved within
    the run.

    Each line's samples come in two halves (their first and second half in time, or two
    blocks); the noise is the larger of the two lines' differences between the medians of
    their halves, never less than `floor`: load from outside the run that lands on one half
    moves that half's median, not the line's cost. The line is within noise when its median
    is no more than the noise above the reference's; below it by any amount passes (the
    target is that the line costs no more), and `below` says when it is lower by more.
    """

    difference: float  # median(line) − median(reference), each over both halves
    noise: float
    halves: tuple[float, float, float, float]  # medians: line's first, second; reference's

    @classmethod
    def of(
        cls,
        line: tuple[Sequence[float], Sequence[float]],
        reference: tuple[Sequence[float], Sequence[float]],
        floor: float = 1.0,
    ) -> Noise:
        medians = tuple(Summary.of(half).median for half in (*line, *reference))
        a, b, c, d = medians
        spread = max(abs(a - b), abs(c - d))
        whole = Summary.of([*line[0], *line[1]]).median
        base = Summary.of([*reference[0], *reference[1]]).median
        return cls(whole - base, max(floor, spread), (a, b, c, d))

    @property
    def within(self) -> bool:
        """The line's median at most the noise above the reference's (False when missing)."""
        return self.difference <= self.noise

    @property
    def below(self) -> bool:
        """The line's median lower than the reference's by more than the noise."""
        return self.difference < -self.noise
