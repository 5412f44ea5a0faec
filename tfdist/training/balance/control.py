"""How a balanced run decides each worker's share of the global batch, from what it measured.

Pure Python on numbers every worker holds alike (each window's sums, gathered in one
all-reduce; `tfdist.strategies.balanced_split`), so that every worker takes the same
decision at the same update without a message from the chief.

After each window of updates, for worker ``w`` with share ``n_w`` and compute seconds
``c_w`` per update (from its inputs being ready to its gradients being ready: its own
work, not its wait for the others), its time per example is ``p_w = c_w / n_w``, averaged
half and half with the windows before it since the split last changed (one busy window
moves it half as far):

* the **target** split is proportional to the rates ``1 / p_w``, no share below ``floor``
  times the even share, in whole units of a worker's replicas, summing to the global batch;
* it is taken only if it cuts the predicted compute time of an update, ``max(n_w p_w)``,
  by at least ``hysteresis`` (so noise does not move the split);
* **only where it pays**: the first window after leaving the even split is judged against
  the even split's last one. Unless the slowest worker's compute time per update fell by at
  least ``min_gain``, the split goes back to even and stays there for 2, then 4, 8, ...
  windows (up to `MAX_BACKOFF`) before trying again: a worker whose time does not shrink
  with its share (it waits on something, a lock, a device, a fixed delay, rather than
  computes) cannot be helped by a smaller one. A worker that is slow outside its compute
  (its input, its callbacks, the network) looks no slower here and is never given less.

The first window of a fit holds its tracing and is only used as the even split's reference
once a second one is measured.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

#: Windows a split that did not pay waits at most before balancing is tried again.
MAX_BACKOFF = 64


def proportional(total: int, rates: Sequence[float], *, unit: int = 1, floor: int = 1) -> list[int]:
    """``total`` examples split in proportion to ``rates``, in multiples of ``unit``, none
    below ``floor`` (itself rounded up to a unit); the largest remainders get the last units."""
    units = total // unit
    least = max(1, -(-floor // unit))
    n = len(rates)
    if least * n > units:
        raise ValueError(f"{total} examples cannot give {n} workers {least * unit} each")
    free = list(range(n))
    ideal = [0.0] * n
    budget = float(units)
    while True:  # clamp to the floor, give the rest out in proportion, until none is clamped
        weight = sum(rates[i] for i in free)
        clamped = [i for i in free if budget * rates[i] / weight < least]
        if not clamped:
            break
        for i in clamped:
            ideal[i] = least
            free.remove(i)
            budget -= least
    for i in free:
        ideal[i] = budget * rates[i] / weight
    shares = [math.floor(x) for x in ideal]
    order = sorted(range(n), key=lambda i: (shares[i] - ideal[i], i))
    for i in order[: units - sum(shares)]:
        shares[i] += 1
    return [s * unit for s in shares]


@dataclasses.dataclass
class Window:
    """One worker's sums over a window: ``updates``, ``compute`` and ``total`` seconds."""

    updates: float
    compute: float
    total: float


@dataclasses.dataclass
class Decision:
    """A new split and why: ``"balance"`` (rates), ``"even"`` (back: it did not pay)."""

    shares: list[int]
    reason: str
    rates: list[float]
    slowest: float  # the slowest worker's compute seconds per update in the last window
    reference: float | None  # the same under the even split, when judged against it


class SplitController:
    """The split of one fit, re-decided after each window (see the module docstring).

    Args:
        global_batch_size: Examples per global batch.
        workers: Workers in sync.
        unit: Replicas per worker: every share is a multiple of it.
        floor: No share below this fraction of the even share.
        hysteresis: Least predicted cut of an update's compute time to change the split.
        min_gain: Least measured cut of the step time for an uneven split to stay.
    """

    def __init__(
        self,
        global_batch_size: int,
        workers: int,
        *,
        unit: int = 1,
        floor: float = 0.25,
        hysteresis: float = 0.05,
        min_gain: float = 0.03,
    ) -> None:
        self.global_batch_size = global_batch_size
        self.unit = unit
        self.floor = max(unit, int(floor * global_batch_size / workers) // unit * unit)
        self.hysteresis = hysteresis
        self.min_gain = min_gain
        self.even = proportional(global_batch_size, [1.0] * workers, unit=unit)
        self.shares = list(self.even)
        self.reference: float | None = None  # the even split's last step time
        self.trial = False  # the split left even and awaits its first judged window
        self.failures = 0
        self.backoff = 0
        self.windows = 0
        self._smoothed: list[float] | None = None  # seconds per example since the last change

    def decide(self, windows: Sequence[Window]) -> Decision | None:
        """The split for the next window after ``windows`` (one per worker), or None: keep."""
        self.windows += 1
        if self.windows == 1 or any(w.updates <= 0 for w in windows):
            return None  # the first holds the traces
        computes = [w.compute / w.updates for w in windows]
        if not all(math.isfinite(c) and c > 0 for c in computes):
            return None
        slowest = max(computes)  # what the others wait for, each update
        times = [c / n for c, n in zip(computes, self.shares)]  # seconds per example
        if self._smoothed is not None:  # the same split as the last window: half of each
            times = [(a + b) / 2 for a, b in zip(times, self._smoothed)]
        self._smoothed = times
        rates = [1.0 / t for t in times]
        if self.shares == self.even:
            self.reference = slowest
        elif self.trial:
            self.trial = False
            if slowest > self.reference * (1.0 - self.min_gain):
                self.failures += 1
                self.backoff = min(2**self.failures, MAX_BACKOFF)
                return self._to(list(self.even), "even", rates, slowest)
        if self.backoff:
            self.backoff -= 1
            return None
        target = proportional(self.global_batch_size, rates, unit=self.unit, floor=self.floor)
        then = max(n * t for n, t in zip(target, times))
        if target == self.shares or slowest - then < self.hysteresis * slowest:
            return None
        self.trial = self.shares == self.even and target != self.even
        return self._to(target, "balance", rates, slowest)

    def _to(self, shares: list[int], reason: str, rates: list[float], slowest: float) -> Decision:
        reference = self.reference if reason == "even" else None
        self.shares, self._smoothed = shares, None
        return Decision(shares, reason, rates, slowest, reference)


def windows_from(rows: Mapping[int, Sequence[float]] | Sequence[Sequence[float]]) -> list[Window]:
    """`Window` records from gathered rows of ``(updates, compute, total)``."""
    items = rows.values() if isinstance(rows, Mapping) else rows
    return [Window(float(r[0]), float(r[1]), float(r[2])) for r in items]
