"""``time_to_accuracy``: wall seconds to a validation accuracy, 1 and 2 workers, two LR rules.

    tfdist bench --benchmarks=time_to_accuracy --threads_per_worker=1 --repeats=3

Two benchmark tasks (``--time_to_accuracy_tasks``, both by default), each trained until its
validation accuracy reaches its target, or its ``max_epochs`` have run ("not reached"),
evaluating on the validation split after every epoch, Adam at 2e-3 (as ``tfdist train``):

* ``digits``: the digits CNN (``tfdist train``'s default model and data:
  ``tfdist.models.get("cnn")`` on scikit-learn's 8x8 digits) to 0.97, 64 examples per worker
  per update. Too small for the exchange to pay: the honest counter-example.
* ``patterns``: the ``convnet`` (66k parameters, 0.15 GFLOP per example forward and backward)
  on ``tfdist.data.load("patterns")`` (4,096 generated 32x32x3 training images, 1,024 to
  validate: noise, and the class's motif at a random place) to 0.99, 64 examples per worker
  per update: compute-bound, a 265 KB gradient exchange against 75-80 ms of compute.

``--per_worker_batch_size`` and ``--target_accuracy`` set every task's, when given. Two
launches of real processes through ``tfdist launch`` (as ``scaling`` starts them), each task
with ``threads_per_worker`` threads on its own core (weak scaling: 2 workers have 2 cores),
each running every benchmark task in turn:

* 1 worker: one process on ``one_device`` (what one would run on one machine without a
  cluster; no collectives);
* 2 workers: two processes on ``multi_worker`` (MultiWorkerMirrored over loopback).

* the uneven pair (``uneven_pair=True``, the default; not with ``quick``): two processes on
  ``multi_worker`` again, worker 1 sharing its core with a CPU hog (a noisy neighbour), the
  linear rule on the even split (``even``) and balanced (``balanced``,
  ``Trainer(balance=BalanceOptions(window=balance_window))``), both at ``balance_window``
  updates per call; with ``uneven_local_sgd`` (none by default) local sides beside them, e.g.
  ``local_sgd_h16_linear`` (every worker takes every update: the pair waits for the slow one
  at each sync) against ``local_sgd_h16_linear_adapt`` (adapting to stragglers: the slow
  worker takes fewer of a round's updates, reading and dropping the others' batches), both
  with ``stragglers=None``; reported per side: each worker's inner steps
  (``steps_per_worker``), examples/s counting only the examples trained on
  (`tfdist.bench.time_to_accuracy.trained`), and adapting over plain
  (``<task>_uneven_<side>_over_plain_seconds``, ``_updates``, ``_examples_per_s``).

* local SGD and DiLoCo on the 2-worker launch (option ``local_sgd``, by default
  ``local_sgd_h4``, ``local_sgd_h16``, ``local_sgd_h64`` and ``diloco_h16``; any
  ``tfdist.bench.harness.fits.LOCAL_SIDE`` name: ``diloco_h16_lr1_m0.5`` another outer SGD,
  a ``_linear`` suffix the linear rule below on the inner optimizer, an ``_adapt`` suffix
  ``adapt_to_stragglers=True`` with ``stragglers=None``; built by
  ``tfdist.bench.harness.fits.local_sgd_option``), by default at the base rate (a replica's
  update sees the per-worker batch). Their validation at an epoch's end between syncs is each
  replica's own copy on its share (a mixed figure), and a fit ends on a sync. Reported
  beside the others: each side's all-reduced bytes per update, for a local side over the
  whole fit and over its whole rounds (``steady_allreduce_bytes_per_update``, the fit's
  end's sync counted apart: ``local_syncs``), and per local side ``<task>_<side>_time_ratio``
  (over 1 worker), ``_updates_ratio`` (over synchronous training on 2 workers at the same LR
  rule), ``_bytes_ratio`` (whole rounds) and ``_fit_bytes_ratio`` (over synchronous
  training's). ``workers=(2,)`` launches the 2 workers alone (a sweep of sides: updates to
  the target do not depend on the host's speed).

* one worker in the 2-worker launch (option ``alone``, False by default): side ``alone``,
  worker 0 training the ``none`` side's Trainer on ``one_device`` by itself while worker 1
  waits (`tfdist.bench.time_to_accuracy.alone`), alternating with the 2-worker sides; each
  2-worker side's steady examples/s and seconds to the target over its, in one launch
  (``<task>_<side>_examples_per_s_same_launch_ratio``, ``_time_same_launch_ratio``): the
  host's speed drifts between launches, so the 1-worker launch's ratios compare fits
  minutes apart. Off by default: it adds about one 1-worker fit per task and repeat to the
  2-worker launch, worker 1 idle, beside the 1-worker launch the default bench runs anyway.

The first two with two LR rules (``tfdist.bench.time_to_accuracy.worker``), the same per-worker
batch, seed and initial weights: *none* (the same rate; the 2-worker global batch is
twice as large) and *linear* (``LRScaling("linear", base_global_batch_size=<per-worker
batch>, warmup_epochs=1)``: the rate times the number of workers, ramped from the base
rate over the first epoch; on 1 worker the same schedule as *none*).

The clock runs from the ``fit`` call (the Trainer's set-up and tracing included, the
process start and the strategy's creation not; each process first runs one untimed
one-epoch fit of each task, so that its one-time costs land on no side) and leaves out the
time spent in validation; ``wall_seconds_to_target`` includes it. Each side runs ``repeats``
times (``--repeats``; the rules alternate in each launch), and its medians are over the runs
during which other processes took at most ``timing.BUSY_CPU`` cores, or over all of them
when none was that quiet. Reported per task and side: seconds, epochs, updates and examples
to the target, examples/s, the final and best validation accuracy and every epoch's point;
per task and LR rule the ratio of 2-worker to 1-worker seconds to the target (below 1: two
workers got there sooner; the goal for ``patterns``: at most 0.6); on the uneven pair each
side's seconds over 1 worker's with the linear rule, and even over balanced.
"""

from __future__ import annotations

import logging
from typing import Any

from tfdist.bench.harness import cluster_run, common, fits, plots, timing
from tfdist.bench.health import parent as health
from tfdist.bench.time_to_accuracy import alone, trained
from tfdist.bench.time_to_accuracy.tasks import GOALS, TASK_OPTIONS, TASKS, check_tasks, task_specs
from tfdist.bench.time_to_accuracy.worker import RULES, UNEVEN_RULES
from tfdist.config import OPTIMIZER_NAMES, check_choice, check_steps_per_execution, invalid_argument

logger = logging.getLogger(__name__)

#: Worker count -> the strategy its launch trains on.
STRATEGIES = {1: "one_device", 2: "multi_worker"}
#: How the JSON and the docs name each rule's side; a key ``<task>_<label>_time_ratio`` per rule.
RULE_LABELS = {"none": "no_scaling", "linear": "linear_scaling"}
DEFAULTS: dict[str, Any] = {
    "tasks": tuple(TASKS),
    # The worker counts launched (`STRATEGIES`'s keys); (2,) for a sweep of 2-worker sides.
    "workers": (1, 2),
    "threads_per_worker": None,
    # None: each task's own (`TASKS`); a value: every task's.
    "per_worker_batch_size": None,
    "target_accuracy": None,
    "max_epochs": None,
    "repeats": 3,
    "optimizer": "adam",
    "learning_rate": 2e-3,
    "warmup_epochs": 1.0,
    # The Trainer's default, as `tfdist train` runs: 32 batches per call on these strategies.
    "steps_per_execution": "auto",
    "seed": 0,
    # A third launch: 2 workers, a CPU hog on worker 1, the even split against balanced.
    "uneven_pair": True,
    "balance_window": 8,
    # Sides of the 2-worker launch on local SGD and DiLoCo (`tfdist.bench.harness.fits`), the
    # base rate: each replica's update sees the per-worker batch, as one worker's does.
    "local_sgd": ("local_sgd_h4", "local_sgd_h16", "local_sgd_h64", "diloco_h16"),
    # Local sides of the uneven pair (needs uneven_pair), e.g. ("local_sgd_h16_linear",
    # "local_sgd_h16_linear_adapt"): what adapting to stragglers buys beside the hog.
    "uneven_local_sgd": (),
    # Side `alone` in the 2-worker launch: worker 0 by itself on one_device, worker 1 waiting.
    "alone": False,
    # Seconds after which a launch's tasks are killed: its fits run one after the other, and
    # a 2-worker launch of 6 sides of patterns took over 900 s (the harness's default) on a
    # busy host.
    "launch_timeout": 3600.0,
}
# --quick and tests: every process real, tiny data, a low target, few epochs (the figures mean
# little; see `QUICK_TASKS`).
QUICK: dict[str, Any] = {"repeats": 1, "uneven_pair": False, "local_sgd": ()}
#: Issue 43's goals for DiLoCo at H = 16 on 2 workers, its seconds over one worker's.
LOCAL_GOALS = {"digits": "<= 0.6", "patterns": "<= 0.56"}
#: Issue 43's goal for DiLoCo at H = 16 on 2 workers: its steady examples/s over one worker's.
LOCAL_THROUGHPUT_GOALS = {"digits": ">= 1.8"}
#: The uneven pair's launch, beside the worker counts' "1" and "2".
UNEVEN = "2_uneven"


def _check(options: dict[str, Any]) -> None:
    options["tasks"] = check_tasks(options["tasks"])
    counts = ("per_worker_batch_size", "max_epochs", "repeats", "balance_window")
    timeout = options["launch_timeout"]
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise invalid_argument("launch_timeout", timeout, "a positive number of seconds")
    cluster_run.check_task_options(options, [k for k in counts if options[k] is not None])
    check_steps_per_execution(options["steps_per_execution"])
    target = options["target_accuracy"]
    if target is not None and (
        isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 < target <= 1
    ):
        raise invalid_argument("target_accuracy", target, "a number in (0, 1]")
    for key in ("learning_rate", "warmup_epochs"):
        value = options[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise invalid_argument(key, value, "a non-negative number")
    if not options["learning_rate"] > 0:
        raise invalid_argument("learning_rate", options["learning_rate"], "a positive number")
    check_choice("optimizer", options["optimizer"], OPTIMIZER_NAMES)
    if isinstance(options["seed"], bool) or not isinstance(options["seed"], int):
        raise invalid_argument("seed", options["seed"], "an integer")
    options["local_sgd"] = fits.check_local_sides(options["local_sgd"], linear=True, adapt=True)
    options["uneven_local_sgd"] = fits.check_local_sides(
        options["uneven_local_sgd"], linear=True, adapt=True, argument="uneven_local_sgd"
    )
    workers = options["workers"]
    if not isinstance(workers, (list, tuple)) or not workers or set(workers) - set(STRATEGIES):
        raise invalid_argument("workers", workers, f"some of {tuple(STRATEGIES)}")
    options["workers"] = tuple(n for n in STRATEGIES if n in workers)
    for key in ("uneven_pair", "alone"):
        if not isinstance(options[key], bool):
            raise invalid_argument(key, options[key], "True or False")
    if options["alone"] and 2 not in options["workers"]:
        raise invalid_argument("alone", True, "False unless workers includes 2")
    if options["uneven_local_sgd"] and not options["uneven_pair"]:
        raise invalid_argument(
            "uneven_local_sgd", options["uneven_local_sgd"], "() unless uneven_pair=True"
        )


def run(**overrides: Any) -> dict[str, Any]:
    """Runs the benchmark and returns its results (no file written; see ``tfdist bench``).

    Args:
        **overrides: Any key of `DEFAULTS`, e.g. ``tasks=("patterns",)``,
            ``target_accuracy=0.95``, ``max_epochs=20``, ``threads_per_worker=1``;
            ``quick=True`` applies `QUICK` and `QUICK_TASKS` first.

    Returns:
        ``{"config", "machine", "tasks": {name: {"config", "per_workers": {"1": {...},
        "2": {...}}, "seconds_to_target"}}, "<task>_no_scaling_time_ratio",
        "<task>_linear_scaling_time_ratio", "goals", ...}``: see docs/scaling.md,
        "Time to accuracy".

    Raises:
        ValueError: For a bad option (Keras-style message naming it).
        RuntimeError: If a worker process failed.
    """
    quick = bool(overrides.get("quick", False))
    options = cluster_run.merge_options(DEFAULTS, QUICK, overrides)
    _check(options)
    threads = options["threads_per_worker"] or cluster_run.default_threads(max(STRATEGIES))
    spec = {
        **{k: v for k, v in options.items() if k not in TASK_OPTIONS},
        "tasks": task_specs(options, quick),
        "learning_rate": float(options["learning_rate"]),
        "warmup_epochs": float(options["warmup_epochs"]),
        "threads_per_worker": threads,
        "kind": "time_to_accuracy",
        "pin_cores": True,
    }
    launches: dict[str, Any] = {}
    for n, strategy in STRATEGIES.items():
        if n not in spec["workers"]:
            continue
        logger.info(
            "bench time_to_accuracy: %d worker(s) on %s, %d thread(s) each", n, strategy, threads
        )
        local = list(spec["local_sgd"]) if n > 1 else []  # on one worker: plain training
        by_itself = {"local_sgd": local, "alone": spec["alone"] and n > 1}
        launches[str(n)] = cluster_run.run_tasks(
            {**spec, "strategy": strategy, "num_pinned_tasks": n, **by_itself},
            workers=n,
            timeout=spec["launch_timeout"],
        )
    if spec["uneven_pair"]:
        spec = {**spec, "local_sgd": [], "alone": False}
        logger.info(
            "bench time_to_accuracy: 2 workers, a CPU hog on worker 1, even, balanced%s",
            "".join(f", {side}" for side in spec["uneven_local_sgd"]),
        )
        uneven = {**spec, "strategy": "multi_worker", "num_pinned_tasks": 2, "uneven": True}
        launches[UNEVEN] = cluster_run.run_tasks(
            {**uneven, "hog_worker": 1}, workers=2, timeout=spec["launch_timeout"]
        )
    return summarise(spec, launches)


def run_summary(run: dict[str, Any], target: float, examples_per_epoch: int) -> dict[str, Any]:
    """One fit's figures from its per-epoch points: to the target (None if not reached), overall.

    Examples count those trained on: a point's ``trained_examples`` where it has one (a local
    side, `trained.with_steps`: fewer when a worker skipped updates), else every example read.
    """
    points = run["points"]
    hit = next((p for p in points if p["val_accuracy"] >= target), None)
    last = points[-1]
    later = last["seconds"] - points[0]["seconds"]
    seen = lambda p: p.get("trained_examples", p["epoch"] * examples_per_epoch)  # noqa: E731
    return {
        "reached": hit is not None,
        "seconds_to_target": hit["seconds"] if hit else None,
        "wall_seconds_to_target": hit["wall_seconds"] if hit else None,
        "epochs_to_target": hit["epoch"] if hit else None,
        "updates_to_target": hit["updates"] if hit else None,
        "examples_to_target": seen(hit) if hit else None,
        "epochs_run": last["epoch"],
        "final_val_accuracy": last["val_accuracy"],
        "best_val_accuracy": max(p["val_accuracy"] for p in points),
        "final_learning_rate": last["learning_rate"],
        # Training examples per training second, the first epoch (tracing) included ...
        "examples_per_s": seen(last) / last["seconds"],
        # ... and after it (None for a one-epoch fit).
        "steady_examples_per_s": (
            (seen(last) - seen(points[0])) / later if len(points) > 1 else None
        ),
        "first_epoch_seconds": points[0]["seconds"],
        "eval_seconds": run["eval_seconds"],
        "fit_seconds": run["fit_seconds"],
        "curve": points,
    }


def _median_or_none(values: list[Any]) -> float | None:
    return None if any(v is None for v in values) else timing.median(values)


def side_summary(
    runs: list[dict[str, Any]], target: float, examples: int, others: list[float | None]
) -> dict[str, Any]:
    """A side over its repeats: medians over the clean runs, or over all when none is clean.

    A run is clean when other processes took at most ``timing.BUSY_CPU`` cores during it (or
    that is unknown), as ``timing.Samples`` counts it. The figures to the target are None
    unless every run reached it.

    Args:
        runs: The fits of this side, in the order run.
        target: The target validation accuracy.
        examples: Training examples per epoch.
        others: Other processes' CPU (cores) during each run, None where unknown.
    """
    summaries = [run_summary(r, target, examples) for r in runs]
    clean = [s for s, o in zip(summaries, others) if o is None or o <= timing.BUSY_CPU]
    used = clean or summaries
    out: dict[str, Any] = {
        "reached": all(s["reached"] for s in summaries),
        "clean_runs": len(clean),
        "others_cpu": others,
    }
    for key in (
        "seconds_to_target",
        "wall_seconds_to_target",
        "epochs_to_target",
        "updates_to_target",
        "examples_to_target",
        "steady_examples_per_s",
    ):
        value = _median_or_none([s[key] for s in used])
        out[key] = value if out["reached"] or not key.endswith("_target") else None
    for key in ("examples_per_s", "final_val_accuracy", "best_val_accuracy", "epochs_run"):
        out[key] = timing.median([s[key] for s in used])
    out["runs"] = summaries
    out["steps_per_worker"] = trained.steps_per_worker(runs)
    return out


def summarise_launch(launched: dict[str, Any], task: dict[str, Any]) -> dict[str, Any]:
    """One benchmark task's sides in one launch (worker-0's clock), and every task's accuracies."""
    name, target = task["name"], task["target_accuracy"]
    processes = launched["tasks"]
    lead_process = processes["worker-0"]
    lead = lead_process["tasks"][name]
    examples = lead["examples_per_epoch"]
    others = health.others_per_sample(processes, "worker-0")
    sides = {}
    for rule in lead["runs"]:
        runs = trained.with_steps(processes, name, rule)
        busy = others.get(f"{name}/{rule}", [None] * len(runs))
        own = lead[alone.SIDE] if rule == alone.SIDE else {}  # one worker's batch and epoch
        sides[rule] = side_summary(runs, target, own.get("examples_per_epoch", examples), busy)
        model_bytes = 4 * lead["parameters"]
        workers = 1 if own else lead_process["num_workers"]
        sides[rule]["allreduce_bytes_per_update"] = bytes_per_update(
            rule, runs, model_bytes, workers
        )
        sides[rule]["steady_allreduce_bytes_per_update"] = bytes_per_update(
            rule, runs, model_bytes, workers, steady=True
        )
        sides[rule]["local_syncs"] = local_syncs(rule, runs)
        if fits.local_side(rule):  # each sync's bytes by fragment (`fits.local_bytes`)
            pieces = lead.get("fragment_bytes", {}).get(rule)
            updates = [r["points"][-1]["updates"] for r in runs]
            sides[rule].update(fits.local_bytes(rule, updates, model_bytes, workers, pieces))
        # Every process's accuracy after each epoch of each fit: the same on every worker.
        sides[rule]["val_accuracy_per_worker"] = {
            t: [
                [p["val_accuracy"] for p in r["points"]]
                for r in process["tasks"][name]["runs"][rule]
            ]
            for t, process in processes.items()
        }
    by_itself = {}  # side alone's batch and epoch, and the other worker's waits
    if alone.SIDE in lead:
        by_itself = {alone.SIDE: {**lead[alone.SIDE], "waits": alone.waits(processes, name)}}
    return {
        "strategy": lead_process["strategy"],
        "num_workers": lead_process["num_workers"],
        **{
            k: lead[k]
            for k in (
                "global_batch_size",
                "updates_per_epoch",
                "examples_per_epoch",
                "train_examples",
                "validation_examples",
                "untimed_first_fit_seconds",
                "parameters",
            )
        },
        "sides": sides,
        **by_itself,
        "chief": [t for t, process in processes.items() if process.get("is_chief")],
        "threads": {t: process["threads"] for t, process in processes.items()},
        "others_cpu_whole_launch": launched["others_cpu"],
        "launch_seconds": launched["launch_seconds"],
    }


def bytes_per_update(
    rule: str, runs: list[dict[str, Any]], model_bytes: int, workers: int, steady: bool = False
) -> float | None:
    """The bytes each worker hands the all-reduce per update (median over the runs; a ring
    sends ``2 (N-1) / N`` of them): the model's float32 bytes per synchronous update (its
    gradient), per sync for a local side, 0 on one worker.

    A local side's fit figure counts every sync of the fit (``fits.sync_counts``), the one that
    ends it after a partial round included; its ``steady`` figure only the whole rounds' over
    their updates (``model_bytes / H``; None when a fit ended before its first whole round),
    the figure that compares with synchronous training's per update.
    """
    if workers == 1:
        return 0.0
    side = fits.local_side(rule)
    if side is None:
        return float(model_bytes)
    updates = [r["points"][-1]["updates"] for r in runs]  # fragments: `fits.local_bytes`
    figures = fits.local_bytes(rule, updates, model_bytes, workers)
    return figures["steady_allreduce_bytes_per_update" if steady else "allreduce_bytes_per_update"]


def local_syncs(rule: str, runs: list[dict[str, Any]]) -> list[list[int]] | None:
    """Each run's syncs of a local side, ``[whole rounds', the fit's end's]`` (None: not one)."""
    side = fits.local_side(rule)
    if side is None:
        return None
    every, k = side.sync_every, side.fragments
    return [list(fits.sync_counts(0, r["points"][-1]["updates"], every, k)) for r in runs]


def summarise_task(task: dict[str, Any], launches: dict[str, Any]) -> dict[str, Any]:
    """One benchmark task: its settings, its sides per worker count, its seconds to the target."""
    per_workers = {n: summarise_launch(launched, task) for n, launched in launches.items()}
    return {
        "config": {k: v for k, v in task.items() if k != "name"},
        "per_workers": per_workers,
        "seconds_to_target": {
            n: {rule: side["seconds_to_target"] for rule, side in entry["sides"].items()}
            for n, entry in per_workers.items()
        },
    }


def summarise(spec: dict[str, Any], launches: dict[str, Any]) -> dict[str, Any]:
    """The config, the machine, each task's sides and its 2-worker / 1-worker ratio per rule."""
    tasks = {task["name"]: summarise_task(task, launches) for task in spec["tasks"]}
    out: dict[str, Any] = {
        "config": {
            **{k: v for k, v in spec.items() if k not in ("kind", "pin_cores", "tasks")},
            "tasks": list(tasks),
            "strategies": {str(n): s for n, s in STRATEGIES.items()},
            "clock": "seconds from the fit call, validation time excluded",
            "rules": {
                "none": "the base learning rate, no warmup",
                "linear": "LRScaling('linear', base_global_batch_size=<per-worker batch>, "
                f"warmup_epochs={spec['warmup_epochs']})",
            },
        },
        "machine": cluster_run.machine(),
        "tasks": tasks,
        "goals": {},
        "words": {},
    }
    for name, task in tasks.items():
        for rule in RULES:
            a, b = (task["seconds_to_target"].get(n, {}).get(rule) for n in ("2", "1"))
            key = f"{name}_{RULE_LABELS[rule]}_time_ratio"
            out[key] = None if a is None or b is None else a / b
            out["words"][key] = f"{name}: 2 / 1 workers, time to accuracy, " + (
                "no LR scaling" if rule == "none" else "linear LR scaling + warmup"
            )
            if GOALS[name]:
                out["goals"][key] = GOALS[name]
        if UNEVEN in task["seconds_to_target"]:
            uneven_ratios(out, name, task["seconds_to_target"])
            sides = {n: entry["sides"] for n, entry in task["per_workers"].items()}
            trained.uneven_local_ratios(out, name, sides[UNEVEN], sides.get("1", {}))
        local_ratios(out, name, task)
        same_launch_ratios(out, name, task)
    out["others_cpu_max"] = timing.nanmax(
        v
        for task in tasks.values()
        for entry in task["per_workers"].values()
        for side in entry["sides"].values()
        for v in side["others_cpu"]
        if v is not None
    )
    return out


def uneven_ratios(out: dict[str, Any], name: str, seconds: dict[str, Any]) -> None:
    """The uneven pair's ratios of task ``name`` into ``out``: each side's seconds to the
    target over 1 worker's (linear rule), and even over balanced (above 1: balance paid)."""
    base, uneven = seconds.get("1", {}).get("linear"), seconds[UNEVEN]
    ratio = lambda a, b: None if a is None or b is None else a / b  # noqa: E731
    for side in UNEVEN_RULES:
        key = f"{name}_uneven_{side}_time_ratio"
        out[key] = ratio(uneven[side], base)
        out["words"][key] = (
            f"{name}: 2 workers, a CPU hog on worker 1, {side} split / 1 worker, time to "
            "accuracy, linear LR scaling + warmup"
        )
    key = f"{name}_uneven_balanced_speedup"
    out[key] = ratio(uneven["even"], uneven["balanced"])
    out["words"][key] = f"{name}: 2 workers, a CPU hog on worker 1: even / balanced seconds"


def local_ratios(out: dict[str, Any], name: str, task: dict[str, Any]) -> None:
    """Each local side's ratios of task ``name`` into ``out``: its seconds to the target and its
    steady examples/s (after the first epoch) on 2 workers over 1 worker's, its updates to the
    target over synchronous training's on 2 workers at the same LR rule (``none``, or
    ``linear`` for a ``_linear`` side), and its bytes per update over synchronous training's:
    ``_bytes_ratio`` whole rounds only (``steady_allreduce_bytes_per_update``: ``1 / H``),
    ``_fit_bytes_ratio`` every sync of the fit, the one that ends it included."""
    two = task["per_workers"].get("2", {}).get("sides", {})
    one = task["per_workers"].get("1", {}).get("sides", {}).get("none", {})
    ratio = timing.ratio_or_none
    for side, figures in two.items():
        local = fits.local_side(side)
        if local is None:
            continue
        sync = two.get("linear" if local.linear else "none", {})
        pairs = {
            "time_ratio": ("seconds_to_target", one),
            "examples_per_s_ratio": ("steady_examples_per_s", one),
            "updates_ratio": ("updates_to_target", sync),
            "fit_bytes_ratio": ("allreduce_bytes_per_update", sync),
        }
        for suffix, (key, base) in pairs.items():
            out[f"{name}_{side}_{suffix}"] = ratio(figures.get(key), base.get(key))
        out[f"{name}_{side}_bytes_ratio"] = ratio(
            figures.get("steady_allreduce_bytes_per_update"),
            sync.get("steady_allreduce_bytes_per_update", sync.get("allreduce_bytes_per_update")),
        )
        out["words"][f"{name}_{side}_time_ratio"] = (
            f"{name}: 2 workers on {side} / 1 worker, time to accuracy"
        )
        out["words"][f"{name}_{side}_examples_per_s_ratio"] = (
            f"{name}: 2 workers on {side} / 1 worker, steady training examples/s"
        )
        out["words"][f"{name}_{side}_bytes_ratio"] = (
            f"{name}: 2 workers on {side} / synchronous, all-reduced bytes per update, whole "
            "rounds (the fit's end's sync in _fit_bytes_ratio)"
        )
        if side == "diloco_h16" and name in LOCAL_GOALS:  # issue 43's goals
            out["goals"][f"{name}_{side}_time_ratio"] = LOCAL_GOALS[name]
        if side == "diloco_h16" and name in LOCAL_THROUGHPUT_GOALS:
            key = f"{name}_{side}_examples_per_s_ratio"
            out["goals"][key] = LOCAL_THROUGHPUT_GOALS[name]


def same_launch_ratios(out: dict[str, Any], name: str, task: dict[str, Any]) -> None:
    """With side ``alone``: each 2-worker side's ratios over it into ``out`` (`alone`), per
    repeat in the task's ``same_launch_per_repeat``; issue 43's goals on ``diloco_h16``'s."""
    sides = task["per_workers"].get("2", {}).get("sides", {})
    per_repeat = alone.same_launch_ratios(out, name, sides, RULE_LABELS)
    if per_repeat:
        task["same_launch_per_repeat"] = per_repeat
    for figure, goals in (("time", LOCAL_GOALS), ("examples_per_s", LOCAL_THROUGHPUT_GOALS)):
        key = f"{name}_diloco_h16_{figure}_same_launch_ratio"
        if key in out and name in goals:
            out["goals"][key] = goals[name]


# ``tfdist bench`` flag -> option of `run`.
FLAG_OPTIONS = {
    "threads_per_worker": "threads_per_worker",
    "per_worker_batch_size": "per_worker_batch_size",
    "target_accuracy": "target_accuracy",
    "time_to_accuracy_tasks": "tasks",
    "time_to_accuracy_alone": "alone",
}


@common.register("time_to_accuracy", plot=plots.plot_time_to_accuracy)
def time_to_accuracy(repeats: int, quick: bool) -> dict[str, Any]:
    """The registered benchmark: `run` with the bench's options (``tfdist bench`` flags)."""
    options = {FLAG_OPTIONS[k]: v for k, v in common.options().items() if k in FLAG_OPTIONS}
    options.setdefault("repeats", repeats)
    return run(quick=quick, **options)
