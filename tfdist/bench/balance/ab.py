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
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from tfdist.bench.harness import timing

#: The A/B sides: side -> what the prefix of its figures says in the summary table.
SIDES = {"pair_ab": "no hog", "loaded_ab": "a hog on each worker's core"}
#: Each A/B side's goals (issue 45), by the figure's name without the side's prefix.
GOALS = {
    "pair_ab": {"ratio": "<= 1.02", "changes_per_1000_updates": "<= 2"},
    "loaded_ab": {"changes_per_1000_updates": "<= 2"},
}


def fit_record(by_worker: Sequence[Mapping[str, Any]], steps_per_epoch: int) -> dict[str, Any]:
    """One fit, from each worker's record of it (the lead's first): its mode, wall and CPU
    seconds per update over its epochs after the first (the CPU summed over the workers: the
    job's), the other processes' CPU then (cores; None: unknown), and the split's changes."""
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
        return {**record, "wall_s": math.nan, "cpu_s": math.nan, "others_cpu": None}
    wall = rows[-1]["t"] - rows[1]["t"]
    cpu = sum(_spent(w, "cpu") for w in by_worker)
    own = cpu + sum(_spent(w, "hog_cpu") for w in by_worker)  # the hogs' CPU is the tasks'
    busy = (rows[-1]["busy_cpu"], rows[1]["busy_cpu"])
    others = None
    if None not in busy and wall > 0:
        others = round(max(busy[0] - busy[1] - own, 0.0) / wall, 2)
    return {**record, "wall_s": wall / measured, "cpu_s": cpu / measured, "others_cpu": others}


def _spent(worker: Mapping[str, Any], key: str) -> float:
    """A worker's ``key`` clock (``cpu``, ``hog_cpu``) from its fit's first epoch's end on."""
    return worker["epochs"][-1][key] - worker["epochs"][1][key]


def launch_record(tasks: Mapping[str, Any], steps_per_epoch: int) -> dict[str, Any]:
    """One A/B launch: its fits (`fit_record`), each mode's median wall and CPU per update,
    balanced over even (``ratio``: wall, ``cpu_ratio``), and the balanced fits' split changes
    per 1,000 of their updates."""
    names = sorted(n for n in tasks if "fits" in tasks[n])  # worker-0 (the lead) first
    fits = [
        fit_record([tasks[n]["fits"][i] for n in names], steps_per_epoch)
        for i in range(min(len(tasks[n]["fits"]) for n in names))
    ]
    modes: dict[str, dict[str, float]] = {}
    for mode in ("even", "balanced"):
        mine = [f for f in fits if f["mode"] == mode]
        modes[mode] = {
            "wall_s": timing.median([f["wall_s"] for f in mine if math.isfinite(f["wall_s"])]),
            "cpu_s": timing.median([f["cpu_s"] for f in mine if math.isfinite(f["cpu_s"])]),
        }
    balanced = [f for f in fits if f["mode"] == "balanced"]
    updates = sum(f["updates"] for f in balanced)
    changes = sum(f["changes"] for f in balanced)
    return {
        "ratio": timing.ratio(modes["balanced"]["wall_s"], modes["even"]["wall_s"]),
        "cpu_ratio": timing.ratio(modes["balanced"]["cpu_s"], modes["even"]["cpu_s"]),
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
    ratios, the split's changes per 1,000 balanced updates over all launches), each launch's
    ratios listed, the side's goals and words, and every launch under ``ab.<side>``."""
    updates = sum(launch["balanced_updates"] for launch in launches)
    changes = sum(launch["changes"] for launch in launches)
    figures = {
        "ratio": timing.median([launch["ratio"] for launch in launches]),
        "cpu_ratio": timing.median([launch["cpu_ratio"] for launch in launches]),
        "changes_per_1000_updates": 1000.0 * changes / updates if updates else math.nan,
    }
    where = SIDES[side]
    words = {
        "ratio": f"{where}, fits alternated in one launch: balanced / even, wall time per update",
        "cpu_ratio": f"{where}, fits alternated in one launch: balanced / even, CPU per update",
        "changes_per_1000_updates": f"{where}: the balanced fits' split changes per 1,000 updates",
    }
    out: dict[str, Any] = {f"{side}_{k}": v for k, v in figures.items()}
    out["goals"] = {f"{side}_{k}": v for k, v in GOALS[side].items()}
    out["words"] = {f"{side}_{k}": v for k, v in words.items()}
    out["ab"] = {
        side: {
            "ratio_samples": [launch["ratio"] for launch in launches],
            "cpu_ratio_samples": [launch["cpu_ratio"] for launch in launches],
            "changes": changes,
            "balanced_updates": updates,
            "launches": list(launches),
        }
    }
    return out
