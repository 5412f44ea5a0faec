"""The A/B sides of ``tfdist bench --benchmarks=balance``: even against balanced, side by side.

Separate launches of one side spread by about +-10% on a shared 2-core host (the even pair's
launches 206-310 ms on the convnet, docs/benchmarks.md), so 3 launches a side cannot show the
2% that issue 45 asks of balance at the even split. An A/B side is **one** launch of 2 real
workers (`tfdist.bench.balance.worker.run_ab`) that alternates the two modes' fits (even,
balanced; balanced, even; ...) on one strategy, so both meet the same host:

* ``pair_ab``: no hog: ``pair_ab_ratio`` (balanced over even, wall time per update; goal
  <= 1.02) and the split's changes per 1,000 balanced updates (goal <= 2);
* ``loaded_ab``: a hog on **each** worker's core, both slowed alike as on a busy host: the
  split must not chase the load (changes per 1,000 balanced updates, goal <= 2), and
  ``loaded_ab_ratio`` says what balance costs there.

A fit's figures are over its epochs after the first (the first holds the traces, and the
balanced fit's first window). Each launch's ratio is the median balanced fit over the median
even fit; a side's ratio is the median over its launches (``--repeats``), each listed.
Every balanced fit starts from the even split and measures again, so short fits give the
split fewer chances to move than one long fit: ``balanced_updates`` says how many counted.

The same work costs 4% more or less from one fit to the next on this host (its other
tenants), so two figures read the fits more robustly than ``ratio``:

* ``yard_ratio``, the host's speed divided out: at each epoch's end every worker times a
  fixed compute, the yardstick (`tfdist.bench.balance.worker.yardstick_cpu_seconds`: a
  matmul chain's CPU). A fit's ``cpu_yards`` is each worker's CPU per update over the median
  of its own yardsticks, summed over the workers: the same work costs more CPU while the
  host's tenants share the core's caches or clock, which ``/proc/stat`` does not show (one
  process on the busy host: fit CPU against yardstick CPU r = 0.81). The yardsticks' own wall
  and CPU are taken out of the fit's (`fit_record`), so they add nothing to either mode.
  ``yard_ratio`` is the median balanced fit's ``cpu_yards`` over the median even fit's.
* ``paired_ratio``, the host's slow drift cancelled: each round's two fits run one after the
  other (even then balanced, then balanced then even, ...), so each balanced fit is paired
  with the even fit beside it (`pairs`), and a pair's ratio sees only what changed within
  its two fits; the order alternates from round to round, so a drift that is linear over a
  pair cancels in the mean too (over an even number of rounds, as the digits' 4).
  ``paired_ratio`` is the mean of the pairs' balanced / even wall per update over all pairs
  of all launches, ``paired_ratio_se`` its standard error (sample standard deviation over
  the square root of the pairs' count), and ``paired_yard_ratio`` (``_se``) the same of
  ``cpu_yards``. ``pair_ab_paired_ratio`` has ``ratio``'s goal (<= 1.02).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from tfdist.bench.harness import timing

#: The A/B sides: side -> what the prefix of its figures says in the summary table.
SIDES = {"pair_ab": "no hog", "loaded_ab": "a hog on each worker's core"}
#: Each A/B side's goals (issue 45), by the figure's name without the side's prefix.
GOALS = {
    "pair_ab": {"ratio": "<= 1.02", "paired_ratio": "<= 1.02", "changes_per_1000_updates": "<= 2"},
    "loaded_ab": {"changes_per_1000_updates": "<= 2"},
}
#: The figures that read the fits against the host's speed (the module's docstring), per side.
ROBUST = (
    "yard_ratio",
    "paired_ratio",
    "paired_ratio_se",
    "paired_yard_ratio",
    "paired_yard_ratio_se",
)


def fit_record(by_worker: Sequence[Mapping[str, Any]], steps_per_epoch: int) -> dict[str, Any]:
    """One fit, from each worker's record of it (the lead's first): its mode, wall and CPU
    seconds per update over its epochs after the first (the CPU summed over the workers: the
    job's; the yardsticks' own wall and CPU left out), the CPU per update in yardsticks
    (``cpu_yards``; NaN without them) with each worker's yardstick and the yardsticks' wall,
    the other processes' CPU then (cores; None: unknown), and the split's changes."""
    lead = by_worker[0]
    rows = lead["epochs"]  # the fit's start, then each epoch's end
    measured = (len(rows) - 2) * steps_per_epoch
    record: dict[str, Any] = {
        "mode": lead["mode"],
        "round": lead.get("round"),
        "updates": (len(rows) - 1) * steps_per_epoch,
        "changes": len(lead.get("splits", ())),
        "splits": list(lead.get("splits", ())),
    }
    if measured <= 0:
        nan = math.nan
        return {**record, "wall_s": nan, "cpu_s": nan, "cpu_yards": nan, "others_cpu": None}
    lost = _yardsticks_wall(by_worker)
    wall = rows[-1]["t"] - rows[1]["t"] - lost
    cpus = [_spent(w, "cpu") - _spent(w, "yard_spent_cpu") for w in by_worker]
    yards = [_yardstick(w) for w in by_worker]
    cpu_yards = sum(c / y for c, y in zip(cpus, yards)) / measured
    # The machine's busy CPU holds the yardsticks' and the hogs' CPU too: all the tasks' own.
    own = sum(_spent(w, "cpu") + _spent(w, "hog_cpu") for w in by_worker)
    busy = (rows[-1]["busy_cpu"], rows[1]["busy_cpu"])
    others = None
    if None not in busy and wall > 0:
        others = round(max(busy[0] - busy[1] - own, 0.0) / wall, 2)
    return {
        **record,
        "wall_s": wall / measured,
        "cpu_s": sum(cpus) / measured,
        "cpu_yards": cpu_yards,
        "yard_cpu_s": yards,  # each worker's median yardstick
        "yard_wall_s": lost,  # the yardsticks' wall inside the measured span, taken out
        "others_cpu": others,
    }


def _spent(worker: Mapping[str, Any], key: str) -> float:
    """A worker's ``key`` clock (``cpu``, ``hog_cpu``, ``yard_spent_cpu``) from its fit's first
    epoch's end on (0 for a clock it did not keep)."""
    return worker["epochs"][-1].get(key, 0.0) - worker["epochs"][1].get(key, 0.0)


def _yardsticks_wall(by_worker: Sequence[Mapping[str, Any]]) -> float:
    """The wall time the yardsticks took inside the lead's measured span (its first epoch's
    end to its last's): at each epoch's end the workers time theirs at once, and the next
    update's all-reduce waits for the slowest, so per epoch end the longest of them."""
    rows = by_worker[0]["epochs"]
    lost = 0.0
    for i in range(2, len(rows)):  # row i's spent - row i-1's: the yardstick at end i-1
        lost += max(
            w["epochs"][i].get("yard_spent_s", 0.0) - w["epochs"][i - 1].get("yard_spent_s", 0.0)
            for w in by_worker
            if len(w["epochs"]) > i
        )
    return lost


def _yardstick(worker: Mapping[str, Any]) -> float:
    """The median of a worker's yardsticks from its fit's first epoch's end on (NaN: none)."""
    yards = [r["yard_cpu"] for r in worker["epochs"][1:] if "yard_cpu" in r]
    return timing.median(yards) if yards and min(yards) > 0 else math.nan


def pairs(fits: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each round's balanced fit with its even fit, the one beside it in the alternation
    (even, balanced; balanced, even; ...): balanced over even, wall per update (``ratio``)
    and in yardsticks (``yard_ratio``). A round without one fit of each mode gives none."""
    rounds: dict[Any, dict[str, list[Mapping[str, Any]]]] = {}
    for i, fit in enumerate(fits):
        key = fit["round"] if fit.get("round") is not None else i // 2
        rounds.setdefault(key, {}).setdefault(fit["mode"], []).append(fit)
    out = []
    for key, modes in rounds.items():
        if len(modes.get("even", ())) != 1 or len(modes.get("balanced", ())) != 1:
            continue
        even, balanced = modes["even"][0], modes["balanced"][0]
        out.append(
            {
                "round": key,
                "ratio": timing.ratio(balanced["wall_s"], even["wall_s"]),
                "yard_ratio": timing.ratio(balanced["cpu_yards"], even["cpu_yards"]),
            }
        )
    return out


def mean_se(values: Sequence[float]) -> tuple[float, float, int]:
    """The mean of the finite ``values``, its standard error (the sample standard deviation
    over the square root of their count; NaN for fewer than 2) and their count."""
    known = [v for v in values if math.isfinite(v)]
    if not known:
        return math.nan, math.nan, 0
    se = statistics.stdev(known) / math.sqrt(len(known)) if len(known) > 1 else math.nan
    return statistics.fmean(known), se, len(known)


def launch_record(tasks: Mapping[str, Any], steps_per_epoch: int) -> dict[str, Any]:
    """One A/B launch: its fits (`fit_record`), each mode's median wall, CPU and yardsticks per
    update, balanced over even (``ratio``: wall, ``cpu_ratio``, ``yard_ratio``), the rounds'
    pairs (`pairs`), and the balanced fits' split changes per 1,000 of their updates."""
    names = sorted(n for n in tasks if "fits" in tasks[n])  # worker-0 (the lead) first
    fits = [
        fit_record([tasks[n]["fits"][i] for n in names], steps_per_epoch)
        for i in range(min(len(tasks[n]["fits"]) for n in names))
    ]
    modes: dict[str, dict[str, float]] = {}
    for mode in ("even", "balanced"):
        mine = [f for f in fits if f["mode"] == mode]
        modes[mode] = {
            key: timing.median([f[key] for f in mine if math.isfinite(f[key])])
            for key in ("wall_s", "cpu_s", "cpu_yards")
        }
    balanced = [f for f in fits if f["mode"] == "balanced"]
    updates = sum(f["updates"] for f in balanced)
    changes = sum(f["changes"] for f in balanced)
    of = lambda key: timing.ratio(modes["balanced"][key], modes["even"][key])  # noqa: E731
    return {
        "ratio": of("wall_s"),
        "cpu_ratio": of("cpu_s"),
        "yard_ratio": of("cpu_yards"),
        "pairs": pairs(fits),
        "modes": modes,
        "changes": changes,
        "balanced_updates": updates,
        "changes_per_1000_updates": 1000.0 * changes / updates if updates else math.nan,
        "others_cpu_max": timing.nanmax(
            f["others_cpu"] for f in fits if f["others_cpu"] is not None
        ),
        "fits": fits,
    }


def side_summary(side: str, launches: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """An A/B side over its launches: the figures as ``<side>_<name>`` (the median launch's
    ratios; the mean and standard error over every launch's pairs; the split's changes per
    1,000 balanced updates over all launches), each launch's ratios listed, the side's goals
    and words, and every launch under ``ab.<side>``."""
    updates = sum(launch["balanced_updates"] for launch in launches)
    changes = sum(launch["changes"] for launch in launches)
    every = [p for launch in launches for p in launch.get("pairs", ())]
    paired, paired_se, n = mean_se([p["ratio"] for p in every])
    yard, yard_se, n_yard = mean_se([p["yard_ratio"] for p in every])
    yard_samples = [launch.get("yard_ratio", math.nan) for launch in launches]
    figures = {
        "ratio": timing.median([launch["ratio"] for launch in launches]),
        "cpu_ratio": timing.median([launch["cpu_ratio"] for launch in launches]),
        "yard_ratio": timing.median([y for y in yard_samples if math.isfinite(y)]),
        "paired_ratio": paired,
        "paired_ratio_se": paired_se,
        "paired_yard_ratio": yard,
        "paired_yard_ratio_se": yard_se,
        "changes_per_1000_updates": 1000.0 * changes / updates if updates else math.nan,
    }
    out: dict[str, Any] = {f"{side}_{k}": v for k, v in figures.items()}
    out["goals"] = {f"{side}_{k}": v for k, v in GOALS[side].items()}
    out["words"] = {f"{side}_{k}": v for k, v in _words(side, paired_se, yard_se).items()}
    out["ab"] = {
        side: {
            "ratio_samples": [launch["ratio"] for launch in launches],
            "cpu_ratio_samples": [launch["cpu_ratio"] for launch in launches],
            "yard_ratio_samples": yard_samples,
            "paired_ratio_samples": _per_launch(launches, "ratio"),
            "paired_yard_ratio_samples": _per_launch(launches, "yard_ratio"),
            "pairs": n,
            "yard_pairs": n_yard,
            "changes": changes,
            "balanced_updates": updates,
            "launches": list(launches),
        }
    }
    return out


def _per_launch(launches: Sequence[Mapping[str, Any]], key: str) -> list[list[float]]:
    """Each launch's pairs' ``key``, a list per launch."""
    return [[p[key] for p in launch.get("pairs", ())] for launch in launches]


def _words(side: str, paired_se: float, yard_se: float) -> dict[str, str]:
    """Each figure of ``side`` in words (the paired ratios with their standard errors)."""
    where = SIDES[side]
    alternated = f"{where}, fits alternated in one launch: balanced / even"
    adjacent = "mean over adjacent pairs of fits"
    return {
        "ratio": f"{alternated}, wall time per update",
        "cpu_ratio": f"{alternated}, CPU per update",
        "yard_ratio": f"{alternated}, CPU per update over a fixed compute's CPU timed beside "
        "each epoch (the host's speed of the moment divided out)",
        "paired_ratio": f"{alternated}, wall time per update, {adjacent} (s.e. {paired_se:.3f})",
        "paired_ratio_se": f"{where}: the standard error of paired_ratio",
        "paired_yard_ratio": f"{alternated}, CPU per update in yardsticks, {adjacent} "
        f"(s.e. {yard_se:.3f})",
        "paired_yard_ratio_se": f"{where}: the standard error of paired_yard_ratio",
        "changes_per_1000_updates": f"{where}: the balanced fits' split changes per 1,000 updates",
    }
