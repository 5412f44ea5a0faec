"""``health``: what the progress watchdog and the straggler report cost a synchronous step.

    tfdist bench --benchmarks=health --threads_per_worker=1 --repeats=5

The Trainer's ``watchdog=WatchdogOptions()`` and ``stragglers=StragglerOptions()``
are on by default: a daemon thread per task that publishes the task's state to
TF's coordination service every second and, on multi-worker runs, timestamps
compiled into the train loop whose per-worker sums the chief scores every
``interval`` seconds. The claim measured: together they cost at most 1% of the
step time.

One launch of 2 real MultiWorkerMirrored worker processes on loopback ports
(``tfdist launch``, as the ``scaling`` and ``stragglers`` benchmarks start them),
each pinned to its own core where the cores allow. Every worker runs
``tfdist.bench.health.worker``: three Trainers on the CNN and scikit-learn's 8x8
digits, SGD, the same weights and global batch, alternating (``off on on_fast``,
``on on_fast off``, ...) with the same steps each:

* *off*: ``watchdog=None, stragglers=None``;
* *on*: the defaults;
* *on_fast*: ``StragglerOptions(interval=1.0, log_scores=True)``, so that the
  workers publish and the chief scores a round every second of each measurement.

Reported: examples/s per side, ``on / off`` and ``on_fast / off`` (of the
medians, and the median of the ratios within each round), the per-step cost in
ms, and what each measured fit observed (health thread alive, step clock on,
straggler rounds scored).
"""

from __future__ import annotations

import logging
from typing import Any

from tfdist.bench.harness import cluster_run, common, plots, timing
from tfdist.bench.health.worker import SIDES
from tfdist.bench.scaling import parent as scaling
from tfdist.config import invalid_argument

logger = logging.getLogger(__name__)

WORKERS = 2
DEFAULTS: dict[str, Any] = {
    "threads_per_worker": None,
    "per_worker_batch_size": 32,
    # About 6 s per measurement at this size on one core per worker (17 ms a step on a quiet
    # Xeon), so that the default straggler interval (5 s) publishes during each and the fast side
    # scores a few rounds in each.
    "steps": 360,
    "repeats": 5,
    "learning_rate": 0.01,
    # One update per call: the step clock's per-call costs (timestamps, the clock vector's
    # fetch, the watchdog's section) are paid at every update, the most they can cost.
    "steps_per_execution": 1,
    "fast_interval": 1.0,
}
# --quick and tests: every process real, the measurements short (the figures mean little), yet
# each on_fast one long enough for the chief to score rounds in it: about 1.2 s, five intervals,
# on a quiet Xeon (40 steps took 0.32 s there, and no round was scored).
QUICK: dict[str, Any] = {
    "per_worker_batch_size": 8,
    "steps": 160,
    "repeats": 2,
    "fast_interval": 0.25,
}
GOAL = 0.99


def _check(options: dict[str, Any]) -> None:
    cluster_run.check_task_options(
        options, ("per_worker_batch_size", "steps", "repeats", "steps_per_execution")
    )
    interval = options["fast_interval"]
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not interval > 0:
        raise invalid_argument("fast_interval", interval, "a positive number of seconds")


def run(**overrides: Any) -> dict[str, Any]:
    """Runs the health benchmark and returns its results (no file written; see ``tfdist bench``).

    Args:
        **overrides: Any key of `DEFAULTS`, e.g. ``steps=200``,
            ``threads_per_worker=1``; ``quick=True`` applies `QUICK` first.

    Returns:
        ``{"config", "machine", "sides", "examples_per_s", "ratio", "on_fast_ratio",
        "paired_ratio", "step_cost_ms", "observed", ...}``: see docs/scaling.md, "Health overhead".

    Raises:
        ValueError: For a bad option (Keras-style message naming it).
        RuntimeError: If a worker process failed.
    """
    options = cluster_run.merge_options(DEFAULTS, QUICK, overrides)
    _check(options)
    threads = options["threads_per_worker"] or cluster_run.default_threads(WORKERS)
    spec = {
        **options,
        "fast_interval": float(options["fast_interval"]),
        "threads_per_worker": threads,
        "kind": "health",
        "pin_cores": True,
        "num_pinned_tasks": WORKERS,
    }
    logger.info("bench health: %d workers, %d thread(s) each", WORKERS, threads)
    launched = cluster_run.run_tasks(spec, workers=WORKERS)
    return summarise(spec, launched)


def summary_config(spec: dict[str, Any], tasks: dict[str, Any]) -> dict[str, Any]:
    """The ``config`` entry of the result: the spec and what each side switched on."""
    return {
        **{k: v for k, v in spec.items() if k not in ("kind", "num_pinned_tasks")},
        "workers": WORKERS,
        "model": "cnn",
        "dataset": "digits",
        "global_batch_size": tasks["worker-0"]["global_batch_size"],
        "sides": {
            "off": "watchdog=None, stragglers=None",
            "on": "the defaults: WatchdogOptions(), StragglerOptions()",
            "on_fast": f"WatchdogOptions(), StragglerOptions(interval={spec['fast_interval']}, "
            "log_scores=True)",
        },
    }


def ratios_to_off(
    name: str, sides: dict[str, Any], others: dict[str, list[float | None]]
) -> dict[str, Any]:
    """Side ``name`` against ``off``: median and paired ratios, clean rounds, cost per step.

    The keys carry the side's prefix: none for ``on``, ``on_fast_`` for ``on_fast``.
    """
    prefix = "" if name == "on" else f"{name}_"
    off = sides["off"]
    # Within each round the sides ran back to back: their ratio cancels slow drifts.
    paired = [
        a / b for a, b in zip(sides[name]["examples_per_s_samples"], off["examples_per_s_samples"])
    ]
    # Rounds in which other processes took at most BUSY_CPU cores during both measurements.
    clean = [
        p
        for p, a, b in zip(paired, others[name], others["off"])
        if a is not None and b is not None and max(a, b) <= timing.BUSY_CPU
    ]
    return {
        f"{prefix}ratio": timing.ratio(
            sides[name]["examples_per_s"], sides["off"]["examples_per_s"]
        ),
        f"{prefix}paired_ratio": timing.median(paired),
        f"{prefix}paired_samples": paired,
        f"{prefix}clean_paired_ratio": timing.median(clean) if clean else None,
        f"{prefix}clean_rounds": len(clean),
        f"{prefix}step_cost_ms": 1e3 * (sides[name]["step_s"] - off["step_s"]),
        f"{prefix}step_cost_fraction": sides[name]["step_s"] / off["step_s"] - 1.0,
    }


def summarise(spec: dict[str, Any], launched: dict[str, Any]) -> dict[str, Any]:
    """The sides' rates, the ratios to ``off``, the per-step cost and what each fit observed."""
    entry = scaling.summarise(launched, WORKERS, task="worker-0")
    sides = entry["sides"]
    tasks = launched["tasks"]
    out: dict[str, Any] = {
        "config": summary_config(spec, tasks),
        "machine": cluster_run.machine(),
        "sides": sides,
        "examples_per_s": {name: sides[name]["examples_per_s"] for name in SIDES},
        "goal": f">= {GOAL}",
    }
    others = others_per_sample(tasks, "worker-0")
    for name in ("on", "on_fast"):
        out.update(ratios_to_off(name, sides, others))
    out["step_ms"] = {name: 1e3 * sides[name]["step_s"] for name in SIDES}
    out["observed"] = {t: r["observed"] for t, r in tasks.items()}
    out["chief"] = [t for t, r in tasks.items() if r.get("is_chief")]
    out["last_scores"] = next(
        (r["last_scores"] for r in tasks.values() if r.get("last_scores")), None
    )
    out["shortest_measurement_s"] = min(
        s for side in sides.values() for s in side["seconds_samples"]
    )
    out["threads"] = entry["threads"]
    out["others_cpu"] = entry["others_cpu"]
    out["others_cpu_samples"] = others
    out["others_cpu_whole_launch"] = entry["others_cpu_whole_launch"]
    out["launch_seconds"] = entry["launch_seconds"]
    out["others_cpu_max"] = timing.nanmax(v for v in entry["others_cpu"].values() if v is not None)
    return out


def others_per_sample(tasks: dict[str, Any], lead: str) -> dict[str, list[float | None]]:
    """Other processes' CPU (cores) in each measurement of each side, as ``scaling`` counts it.

    The machine's busy CPU during ``lead``'s measurement minus every task's own CPU in its
    measurement of the same index; None where unknown.
    """
    out: dict[str, list[float | None]] = {}
    for name, records in tasks[lead]["records"].items():
        out[name] = []
        for i, rec in enumerate(records):
            own = sum(t["records"][name][i]["cpu_seconds"] for t in tasks.values())
            busy = rec["busy_cpu_seconds"]
            known = busy is not None and rec["seconds"] > 0
            out[name].append(round(max(busy - own, 0.0) / rec["seconds"], 2) if known else None)
    return out


# ``tfdist bench`` flag -> option of `run`.
FLAG_OPTIONS = {"threads_per_worker": "threads_per_worker"}


@common.register("health", plot=plots.plot_health)
def health(repeats: int, quick: bool) -> dict[str, Any]:
    """The registered benchmark: `run` with the bench's options (``tfdist bench`` flags)."""
    options = {FLAG_OPTIONS[k]: v for k, v in common.options().items() if k in FLAG_OPTIONS}
    options.setdefault("repeats", repeats)
    return run(quick=quick, **options)
