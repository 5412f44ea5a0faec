"""How a balanced run decides each worker's share of the global batch, from what it measured.

Pure Python on numbers every worker holds alike (each window's sums, gathered in one
all-reduce; `tfdist.strategies.balanced_split`), so that every worker takes the same
decision at the same update without a message from the chief.

Each window gives, per worker ``w`` with share ``n_w``, its compute seconds per update
``c_w``: from its inputs being ready to its gradients being ready, its own work and not its
wait for the others in the collective (`tfdist.strategies.step_clock`). The controller keeps
the windows since the split last changed (the last `HISTORY` of them) and:

* **a rate that noise does not move:** each worker's compute per update is the **median**
  of those windows, and nothing is decided before `SETTLE` windows at the current split (so
  one busy window, or the first one after a change, moves nothing);
* **the target** split is proportional to the rates ``n_w / c_w``, no share below ``floor``
  times the even share, in whole units of a worker's replicas, summing to the global batch;
* **a move must pay more than it costs:** the predicted gain is the cut of an update's
  compute time, ``max(c_w) - max(n'_w c_w / n_w)``; the cost is ``hysteresis`` times the
  update's compute time plus the estimate's noise band (the median distance of the gain
  predicted from each window alone to the median's; twice that to leave the even split, the
  safe one, which also takes `HISTORY` windows). The split moves only when the gain exceeds
  the cost; both are in the `Decision`, and in the chief's log line;
* **judged where it moved:** once `SETTLE` windows are measured at a split that left the
  even one, the worker that was given the smaller share must have had its compute time cut
  by at least ``min_gain`` of it, or a quarter of the predicted cut where that is less. A
  first partial move with a fixed cost per update cuts less than proportionally but still
  cuts, and the next decision takes the rest (the rates are measured again at the new
  split). A worker whose time does not shrink with its share (it waits on something, a lock,
  a device, a fixed delay, rather than computes) cannot be helped by a smaller one: the
  split goes back to even and stays there for 2, then 4, 8, ... windows (up to
  `MAX_BACKOFF`) before trying again. A worker that is slow outside its compute (its input,
  its callbacks, the network) looks no slower here and is never given less.

The first window of a fit holds its tracing and is dropped.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence

#: Windows a split that did not pay waits at most before balancing is tried again.
MAX_BACKOFF = 64
#: Windows at one split whose median is each worker's compute per update.
HISTORY = 5
#: Windows measured at a split before it is judged or changed.
SETTLE = 3
#: Share of the predicted cut a move must realize on the worker it unloaded (else: it waits).
REALIZED = 0.25


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
class Judged:
    """Why a split went back to even: ``worker`` was given fewer examples, and its compute
    per update went from ``before`` to ``after`` seconds where ``predicted`` was expected."""

    worker: int
    before: float
    predicted: float
    after: float
    backoff: int


@dataclasses.dataclass
class Decision:
    """A new split and why: ``"balance"`` (rates), ``"even"`` (back: it did not pay),
    ``"fixed"`` (given).

    ``step`` is the update's compute time now (the slowest worker's median, seconds),
    ``gain`` the predicted cut of it, ``cost`` what the move had to beat (the hysteresis and
    the noise ``band``), over ``windows`` windows; ``judged`` says why a split went back."""

    shares: list[int]
    reason: str
    rates: list[float]
    step: float = 0.0
    gain: float = 0.0
    cost: float = 0.0
    band: float = 0.0
    windows: int = 0
    judged: Judged | None = None


@dataclasses.dataclass
class _Move:
    """A move awaiting its judgement: the worker unloaded, its compute before, as predicted."""

    worker: int
    before: float
    predicted: float


class SplitController:
    """The split of one fit, re-decided after each window (see the module docstring).

    Args:
        global_batch_size: Examples per global batch.
        workers: Workers in sync.
        unit: Replicas per worker: every share is a multiple of it.
        floor: No share below this fraction of the even share.
        hysteresis: Least predicted cut of an update's compute time (a fraction of it) on top
            of the estimate's noise band to change the split.
        min_gain: Least measured cut of the unloaded worker's compute time (a fraction of it,
            or a quarter of the predicted cut where less) for a split away from even to stay.
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
        self.failures = 0
        self.backoff = 0
        self.windows = 0
        self.history: list[list[float]] = []  # compute s/update per worker, at this split
        self._move: _Move | None = None

    def decide(self, windows: Sequence[Window]) -> Decision | None:
        """The split for the next window after ``windows`` (one per worker), or None: keep."""
        self.windows += 1
        if self.windows == 1 or any(w.updates <= 0 for w in windows):
            return None  # the first holds the traces
        computes = [w.compute / w.updates for w in windows]
        if not all(math.isfinite(c) and c > 0 for c in computes):
            return None
        self.history = [*self.history, computes][-HISTORY:]
        # Leaving the even split takes a full history: most windows must agree who is slow.
        if len(self.history) < (HISTORY if self.shares == self.even else SETTLE):
            return None
        medians = [statistics.median(h[w] for h in self.history) for w in range(len(computes))]
        rates = [n / c for n, c in zip(self.shares, medians)]
        if self._move is not None:
            move, self._move = self._move, None
            after = medians[move.worker]
            needed = min(self.min_gain * move.before, REALIZED * (move.before - move.predicted))
            if move.before - after < needed:
                self.failures += 1
                self.backoff = min(2**self.failures, MAX_BACKOFF)
                judged = Judged(move.worker, move.before, move.predicted, after, self.backoff)
                return self._to(Decision(list(self.even), "even", rates, judged=judged))
            self.failures = 0
        if self.backoff:
            self.backoff -= 1
            return None
        return self._balance(medians, rates)

    def _balance(self, medians: list[float], rates: list[float]) -> Decision | None:
        """The proportional split, if its predicted gain beats the cost of moving."""
        target = proportional(self.global_batch_size, rates, unit=self.unit, floor=self.floor)
        if target == self.shares:
            return None
        step, gain = _gain(medians, self.shares, target)
        gains = [_gain(h, self.shares, target)[1] for h in self.history]
        # Leaving even, the safe split, takes twice the evidence.
        band = statistics.median(abs(g - gain) for g in gains) * (
            2 if self.shares == self.even else 1
        )
        cost = self.hysteresis * step + band
        if gain <= cost:
            return None
        decision = Decision(target, "balance", rates, step, gain, cost, band, len(self.history))
        if self.shares == self.even:  # leaving even: judged where it unloads a worker most
            worker = min(range(len(target)), key=lambda w: target[w] / self.shares[w])
            predicted = medians[worker] * target[worker] / self.shares[worker]
            self._move = _Move(worker, medians[worker], predicted)
        return self._to(decision)

    def _to(self, decision: Decision) -> Decision:
        self.shares, self.history = list(decision.shares), []
        if decision.reason == "even":
            self._move = None
        return decision


def _gain(computes: Sequence[float], shares: Sequence[int], target: Sequence[int]):
    """(the update's compute time now, its predicted cut at ``target``): each worker's
    compute scaled by its share."""
    now = max(computes)
    then = max(c * t / n for c, n, t in zip(computes, shares, target))
    return now, now - then


def windows_from(rows: Mapping[int, Sequence[float]] | Sequence[Sequence[float]]) -> list[Window]:
    """`Window` records from gathered rows of ``(updates, compute, total)``."""
    items = rows.values() if isinstance(rows, Mapping) else rows
    return [Window(float(r[0]), float(r[1]), float(r[2])) for r in items]
