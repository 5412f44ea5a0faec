"""``stragglers``: one slowed worker, MWMS and parameter-server training side by side.

    tfdist bench --benchmarks=stragglers --straggler_factor=2 --threads_per_worker=1

The claim measured: synchronous training (MultiWorkerMirroredStrategy) waits
for its slowest worker at every step, while asynchronous parameter-server
training carries on with the others. Two launches of real processes on
loopback ports (``tfdist launch``, as the ``scaling`` benchmark starts them):
2 workers under MWMS, each pinned to its own core where the cores allow; then
2 workers, 1 ps and the chief (coordinator) under ParameterServerStrategy,
unpinned. Every task runs ``tfdist.bench.stragglers.worker``: the Trainer on the
CNN and scikit-learn's 8x8 digits, SGD, the same global batch on both
strategies.

In each launch two sides alternate (A B, B A, ...), the same steps each:
*balanced* and *straggler*, where worker 1 sleeps before each of its batches
(TF's ``SleepDataset`` after its input pipeline) for ``factor`` times a
worker's unslowed step period, measured in the same launch just before (the
sleep overlaps the step, one batch ahead, so that worker takes a batch every
``factor`` periods; see ``tfdist.bench.stragglers.worker``). The
result holds, per strategy, examples/s of both sides and
``straggler / balanced``; what was injected (seconds per batch, on which
worker); and for reference the ratio of a fully synchronous step (``1 /
factor``) and of two independent workers, one slowed (``(1 + 1/factor) / 2``).
Under PS it also counts the batches each worker drew in a short run of
closures, a check that the sleep landed on worker 1 only.
"""

from __future__ import annotations

import logging
from typing import Any

from tfdist.bench.harness import cluster_run, common, plots, timing
from tfdist.bench.scaling import parent as scaling
from tfdist.config import invalid_argument

logger = logging.getLogger(__name__)

WORKERS = 2
STRAGGLER = 1  # the worker that sleeps: not worker 0, which records under MWMS
DEFAULTS: dict[str, Any] = {
    "factor": 2.0,
    "threads_per_worker": None,
    "per_worker_batch_size": 32,
    "steps": 40,
    "repeats": 3,
    "learning_rate": 0.01,
}
# --quick and tests: every process real, few steps.
QUICK: dict[str, Any] = {"per_worker_batch_size": 8, "steps": 8, "repeats": 2}
STRATEGIES = {"multi_worker": "stragglers", "parameter_server": "stragglers_ps"}


def _check(options: dict[str, Any]) -> None:
    factor = options["factor"]
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor >= 1.0:
        raise invalid_argument(
            "straggler_factor", factor, "a number >= 1 (how many times slower worker 1 steps)"
        )
    cluster_run.check_task_options(options, ("per_worker_batch_size", "steps", "repeats"))


def run(**overrides: Any) -> dict[str, Any]:
    """Runs the straggler benchmark and returns its results (no file written; see ``tfdist bench``).

    Args:
        **overrides: Any key of `DEFAULTS`, e.g. ``factor=3.0``,
            ``threads_per_worker=1``, ``steps=20``; ``quick=True`` applies `QUICK` first.

    Returns:
        ``{"config", "machine", "injected", "multi_worker", "parameter_server",
        "multi_worker_ratio", "parameter_server_ratio", "expected_sync_ratio",
        "expected_independent_ratio", ...}``: see docs/scaling.md, "Stragglers".

    Raises:
        ValueError: For a bad option (Keras-style message naming it).
        RuntimeError: If a worker process failed.
    """
    options = cluster_run.merge_options(DEFAULTS, QUICK, overrides)
    _check(options)
    threads = options["threads_per_worker"] or cluster_run.default_threads(WORKERS)
    spec = {
        **options,
        "factor": float(options["factor"]),
        "threads_per_worker": threads,
        "workers": WORKERS,
        "straggler": STRAGGLER,
    }
    per_strategy: dict[str, Any] = {}
    injected: dict[str, Any] = {}
    for name, kind in STRATEGIES.items():
        logger.info("bench stragglers: %s, %d workers, factor %.2f", name, WORKERS, spec["factor"])
        if name == "multi_worker":
            task_spec = {**spec, "kind": kind, "pin_cores": True, "num_pinned_tasks": WORKERS}
            launched = cluster_run.run_tasks(task_spec, workers=WORKERS)
            lead, source = "worker-0", f"worker-{STRAGGLER}"  # the straggler computed its delay
        else:
            task_spec = {**spec, "kind": kind, "pin_cores": False}
            launched = cluster_run.run_tasks(task_spec, workers=WORKERS, ps=1, chief=True)
            lead = source = "chief-0"
        per_strategy[name] = scaling.summarise(launched, WORKERS, task=lead)
        injected[name] = launched["tasks"][source]["injected"]
        drawn = launched["tasks"][lead].get("batches_drawn_per_worker")
        if drawn is not None:
            per_strategy[name]["batches_drawn_per_worker"] = drawn
    return _result(spec, per_strategy, injected)


def _result(
    spec: dict[str, Any], per_strategy: dict[str, Any], injected: dict[str, Any]
) -> dict[str, Any]:
    factor = spec["factor"]
    out: dict[str, Any] = {
        "config": {
            **{k: v for k, v in spec.items() if k not in ("kind",)},
            "model": "cnn",
            "dataset": "digits",
            "global_batch_size": spec["per_worker_batch_size"] * WORKERS,
            "ps": {"num_ps": 1, "chief": True, "pinned": False},
            "multi_worker": {"pinned": True},
        },
        "machine": cluster_run.machine(),
        "injected": injected,
    }
    for name, entry in per_strategy.items():
        sides = entry["sides"]
        rates = {side: sides[side]["examples_per_s"] for side in ("balanced", "straggler")}
        out[name] = entry
        out[f"{name}_examples_per_s"] = rates
        out[f"{name}_ratio"] = timing.ratio(rates["straggler"], rates["balanced"])
        # Seconds a step gained: compare with the injected seconds per batch.
        out[f"{name}_added_step_s"] = sides["straggler"]["step_s"] - sides["balanced"]["step_s"]
        # The injected sleep over the balanced period measured in the alternation (the
        # calibration before it may have been disturbed), and what it predicts for this strategy.
        period = injected[name]["worker_step_in_cluster_steps"] * sides["balanced"]["step_s"]
        effective = max(1.0, injected[name]["seconds_per_batch"] / period)
        out[f"{name}_effective_factor"] = effective
        out[f"{name}_expected_ratio"] = (
            1.0 / effective if name == "multi_worker" else (WORKERS - 1 + 1.0 / effective) / WORKERS
        )
    out["expected_sync_ratio"] = 1.0 / factor
    out["expected_independent_ratio"] = (WORKERS - 1 + 1.0 / factor) / WORKERS
    out["others_cpu_max"] = timing.nanmax(
        v for entry in per_strategy.values() for v in entry["others_cpu"].values() if v is not None
    )
    return out


# ``tfdist bench`` flag -> option of `run`.
FLAG_OPTIONS = {"straggler_factor": "factor", "threads_per_worker": "threads_per_worker"}


@common.register("stragglers", plot=plots.plot_stragglers)
def stragglers(repeats: int, quick: bool) -> dict[str, Any]:
    """The registered benchmark: `run` with the bench's options (``tfdist bench`` flags)."""
    options = {FLAG_OPTIONS[k]: v for k, v in common.options().items() if k in FLAG_OPTIONS}
    options.setdefault("repeats", repeats)
    return run(quick=quick, **options)
