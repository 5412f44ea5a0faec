"""Timing on a noisy machine: stopwatches that see other processes, and alternation.

Every measurement records its wall seconds, this process's CPU seconds and,
on Linux, the CPU seconds other processes (and the hypervisor) took meanwhile.
The last says whether the machine was shared during that measurement: on a
2-core machine ``others_cpu`` near 0 means the figures are clean, near 1 means
another process took a core. Medians are taken over the clean measurements, and
`alternate` adds a few rounds when too few were clean.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

logger = logging.getLogger(__name__)

# /proc/stat "cpu" fields counted as busy: user nice system (idle iowait) irq softirq steal.
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)
# /proc/stat counts in ticks (10 ms): shorter measurements cannot tell who used the CPU.
_MIN_SECONDS_FOR_OTHERS = 0.25
# A measurement while other processes took more CPU cores than this is not clean.
BUSY_CPU = 0.25


def busy_cpu_seconds() -> float | None:
    """CPU seconds all processes have used since boot (Linux), else None."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
        return sum(int(fields[i]) for i in _BUSY_FIELDS if i < len(fields)) / os.sysconf(
            "SC_CLK_TCK"
        )
    except (OSError, ValueError, IndexError):
        return None


class Timing(NamedTuple):
    """What one measurement took."""

    seconds: float
    cpu_seconds: float  # this process
    others_cpu_seconds: float | None  # every other process, None where unknown

    @property
    def cpu_share(self) -> float:
        """This process's CPU seconds per wall second (up to the core count)."""
        return self.cpu_seconds / self.seconds if self.seconds > 0 else math.nan

    @property
    def others_cpu(self) -> float:
        """Other processes' CPU seconds per wall second (NaN where unknown or too short to tell)."""
        if self.others_cpu_seconds is None or self.seconds < _MIN_SECONDS_FOR_OTHERS:
            return math.nan
        return max(self.others_cpu_seconds, 0.0) / self.seconds


class Stopwatch:
    """Wall, own-CPU and others'-CPU time between `start` and `stop`."""

    def start(self) -> None:
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        self._busy = busy_cpu_seconds()

    def stop(self) -> Timing:
        wall, cpu, busy = time.perf_counter(), time.process_time(), busy_cpu_seconds()
        cpu -= self._cpu
        others = None if busy is None or self._busy is None else (busy - self._busy) - cpu
        return Timing(wall - self._wall, cpu, others)


def timed(fn: Callable[[], Any]) -> Timing:
    """Runs ``fn()`` (which must block until its work is done) and returns its Timing."""
    watch = Stopwatch()
    watch.start()
    fn()
    return watch.stop()


# A side of a comparison: one measurement per call, returning (value, its Timing).
Side = Callable[[], tuple[float, Timing]]


@dataclasses.dataclass
class Samples:
    """Measurements per side, in the order taken.

    ``values`` are what the sides measured; ``seconds`` the wall seconds each
    measurement's Timing took (so a rate can be checked against the time it
    came from); ``cpu_share`` and ``others_cpu`` are this process's and other
    processes' CPU seconds per wall second during each measurement (see
    `Timing`). A measurement is *clean* when other processes took at
    most `BUSY_CPU` cores meanwhile (or it is unknown).
    """

    values: dict[str, list[float]]
    cpu_share: dict[str, list[float]]
    others_cpu: dict[str, list[float]]
    seconds: dict[str, list[float]] = dataclasses.field(default_factory=dict)

    def clean(self, name: str) -> list[float]:
        """The clean values of side ``name``."""
        return [
            v for v, busy in zip(self.values[name], self.others_cpu[name]) if not busy > BUSY_CPU
        ]

    def median(self, name: str) -> float:
        """The median of the clean values of side ``name``, or of all of them if none is clean."""
        return median(self.clean(name) or self.values[name])

    def max_others_cpu(self) -> float:
        """The most CPU other processes took during any measurement (NaN if unknown)."""
        return nanmax(v for vs in self.others_cpu.values() for v in vs)

    def as_dict(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "clean": {name: len(self.clean(name)) for name in self.values},
        }


def alternate(
    sides: Mapping[str, Side], repeats: int, *, extra_rounds: int | None = None
) -> Samples:
    """Runs each side ``repeats`` times, interleaved A B C, C B A, A B C, ...

    Interleaving (and reversing the order every round) spreads the machine's
    slow drifts and bursts evenly over the sides. While other processes make
    measurements unclean, up to ``extra_rounds`` more rounds run until every
    side has a majority of clean ones (``repeats // 2 + 1``). Logs one line per
    measurement (side, round of ``repeats``, seconds).

    Args:
        sides: Name -> a zero-arg callable that runs one measurement and
            returns ``(value, timing)``, e.g. examples per second.
        repeats: Measurements per side (at least).
        extra_rounds: Most rounds added for unclean measurements; default
            ``repeats // 2 + 1``.
    """
    names = list(sides)
    samples = Samples(*({name: [] for name in names} for _ in range(4)))
    wanted = repeats // 2 + 1
    extra_rounds = wanted if extra_rounds is None else extra_rounds
    r = 0
    while r < repeats or (
        r < repeats + extra_rounds and any(len(samples.clean(n)) < wanted for n in names)
    ):
        for name in names if r % 2 == 0 else names[::-1]:
            value, timing = sides[name]()
            logger.info("bench: %s %s (%.1f s)", name, _round_label(r, repeats), timing.seconds)
            samples.values[name].append(float(value))
            samples.seconds[name].append(timing.seconds)
            samples.cpu_share[name].append(round(timing.cpu_share, 2))
            samples.others_cpu[name].append(round(timing.others_cpu, 2))
        r += 1
    return samples


def _round_label(r: int, repeats: int) -> str:
    """``2/5`` for round index 1 of 5; rounds past ``repeats`` are extra (for unclean ones)."""
    return f"{r + 1}/{repeats}" if r < repeats else f"{r + 1}, extra: too few clean"


def nanmax(values: Iterable[float]) -> float:
    """The largest of ``values`` that is not NaN (NaN for none)."""
    known = [v for v in values if not math.isnan(v)]
    return max(known) if known else math.nan


def median(values: list[float]) -> float:
    """The median of ``values`` (NaN for none)."""
    return float(statistics.median(values)) if values else math.nan


def ratio(numerator: float, denominator: float) -> float:
    """``numerator / denominator``, NaN when the denominator is not positive."""
    return float(numerator / denominator) if denominator > 0 else math.nan


def ratio_or_none(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, None when either is missing or the denominator is 0 (a
    side that did not reach its target, or was not run)."""
    return None if numerator is None or not denominator else numerator / denominator
