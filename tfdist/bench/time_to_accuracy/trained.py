"""The examples a local side trained on, each worker's inner steps, and the uneven pair's local
figures (``time_to_accuracy``'s ``uneven_local_sgd``).

A local side adapting to stragglers (a `tfdist.bench.harness.fits.LOCAL_SIDE` name ending in
``_adapt``: ``LocalSGDOptions(adapt_to_stragglers=True)``) lets a slower worker skip some of a
round's updates: it reads those batches and drops them. Its examples/s count only the examples
trained on: every worker's inner steps (the ``local_steps`` its logs carry after each epoch)
times its share of the global batch. A side that skips nothing (no ``local_steps`` logged)
takes every update on every worker, so its figures are as before: updates x global batch.
"""

from __future__ import annotations

from typing import Any

from tfdist.bench.harness import fits, timing

#: What the uneven pair's adapting side is compared on, with its plain side's: figure -> key.
OVER_PLAIN = {
    "seconds": "seconds_to_target",
    "updates": "updates_to_target",
    "examples_per_s": "steady_examples_per_s",
}


def with_steps(
    processes: dict[str, Any], name: str, rule: str, lead: str = "worker-0"
) -> list[dict[str, Any]]:
    """The lead's runs of side ``rule`` of task ``name``, a local side's points each with every
    worker's inner steps so far (``local_steps``: ``{task: steps}``, the updates where a worker
    logged none) and the examples they trained on (``trained_examples``); another side's
    runs as they are.

    Args:
        processes: Each launched task's record (``{"worker-0": {"tasks": ..., "num_workers"},
            ...}``); every worker ran the same fits to the same epochs.
        name: The benchmark task.
        rule: The side.
        lead: Whose runs (and clock) the side reports.
    """
    runs = processes[lead]["tasks"][name]["runs"][rule]
    if fits.local_side(rule) is None:
        return runs
    workers = processes[lead]["num_workers"]
    share = processes[lead]["tasks"][name]["global_batch_size"] // workers
    out = []
    for i, run in enumerate(runs):
        points = []
        for j, point in enumerate(run["points"]):
            steps = {
                task: process["tasks"][name]["runs"][rule][i]["points"][j].get(
                    "local_steps", point["updates"]
                )
                for task, process in processes.items()
            }
            trained = share * sum(steps.values())
            points.append({**point, "local_steps": steps, "trained_examples": trained})
        out.append({**run, "points": points})
    return out


def steps_per_worker(runs: list[dict[str, Any]]) -> dict[str, list[int]] | None:
    """Each worker's inner steps in each run (at its last epoch; the target's when reached), or
    None for a side that is not local (`with_steps`)."""
    if not runs or "local_steps" not in runs[0]["points"][-1]:
        return None
    return {
        task: [run["points"][-1]["local_steps"][task] for run in runs]
        for task in runs[0]["points"][-1]["local_steps"]
    }


def uneven_local_ratios(
    out: dict[str, Any], name: str, uneven: dict[str, Any], one: dict[str, Any]
) -> None:
    """The uneven pair's local sides' ratios of task ``name`` into ``out``.

    Per local side, ``<name>_uneven_<side>_time_ratio``: its seconds to the target over one
    worker's (the same LR rule; None without the 1-worker launch); per adapting side whose
    plain side ran beside it (the name without ``_adapt``),
    ``<name>_uneven_<side>_over_plain_<figure>``, adapting / plain, of `OVER_PLAIN`'s
    figures: seconds and updates to the target (below 1: adapting paid, or cost no updates)
    and steady examples/s trained on (above 1: adapting trained faster).

    Args:
        out: The results, with their ``words``.
        name: The benchmark task.
        uneven: The uneven pair's sides.
        one: One worker's sides (empty when not launched).
    """
    ratio = timing.ratio_or_none
    for side, figures in uneven.items():
        local = fits.local_side(side)
        if local is None:
            continue
        base = one.get("linear" if local.linear else "none", {})
        key = f"{name}_uneven_{side}_time_ratio"
        out[key] = ratio(figures["seconds_to_target"], base.get("seconds_to_target"))
        out["words"][key] = (
            f"{name}: 2 workers, a CPU hog on worker 1, {side} / 1 worker, time to accuracy"
        )
        plain = uneven.get(side.removesuffix("_adapt")) if local.adapt else None
        if plain is None:
            continue
        for figure, field in OVER_PLAIN.items():
            key = f"{name}_uneven_{side}_over_plain_{figure}"
            out[key] = ratio(figures[field], plain[field])
            out["words"][key] = (
                f"{name}: 2 workers, a CPU hog on worker 1, adapting to stragglers / not, "
                + {
                    "seconds": "seconds to the target",
                    "updates": "updates to the target",
                    "examples_per_s": "steady examples/s trained on",
                }[figure]
            )
