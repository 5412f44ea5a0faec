"""``language_model``: a small GPT on real text, tokens/s of each way to train it, and time to a
target bits per byte on 1 and 2 workers.

    tfdist bench --benchmarks=language_model

The model is ``tfdist.models.get("gpt", width=64, depth=2, heads=4)`` (``tfdist train
--model=gpt``'s default size) on ``tfdist.data.load("python_source", seq_len=128)``, the
interpreter's standard library as bytes; Adam at 5e-3, a global batch of 32 windows of 128
bytes on every side (4,096 tokens per update), the same seeded initial weights. Two launches
of real processes through ``tfdist launch`` (`tfdist.bench.language_model.worker`), each side
using the machine's 2 cores:

* one process, 2 threads, 2 logical CPU devices: plain Keras ``model.fit`` on one device
  (``keras_fit``, the reference), the Trainer on ``one_device`` (``trainer``), on
  ``mirrored`` x2 (``mirrored``), on ``mirrored`` x2 with ``sharding="gradients"``
  (``sharded``) and a 2-stage pipeline cut between blocks (``pipeline``, 4 micro-batches), timed
  alternately, ``repeats`` fits of ``steps`` updates each after an untimed one;
* two processes on ``multi_worker``, one thread each (unpinned, as the one process is): the
  Trainer (``multi_worker``), the same global batch (16 windows per worker); beside it local
  SGD and DiLoCo (option ``local_sgd``, by default ``local_sgd_h16``, a parameter average every
  16 updates, and ``diloco_h16``, the averaged change to an outer SGD(0.7, Nesterov momentum
  0.9); Adam inside, as every side; `tfdist.bench.harness.fits.local_sgd_option`).

Then each launch trains the Trainer (one_device; multi_worker) from fresh weights, with 50
warmup steps, until the validation bits per byte (every ``eval_every`` updates, on 64 KB of
validation text) reach ``target_bits_per_byte``: both read the same global batches, so they
need about the same updates, and the seconds (validation excluded) compare their speeds.
The 2-worker launch then trains each side of ``local_sgd_to_target`` (by default
``diloco_h16``) to the same target from fresh weights: its updates to the target are the
convergence cost of syncing every H updates, its seconds what that buys.

Reported: tokens/s per side (the median over the fits during which other processes took at
most ``timing.BUSY_CPU`` cores, else over all), each side over plain Keras (the goal: the
Trainer on one device >= 0.95), the seconds and updates to the target on 1 and 2 workers and
their ratio, each local-SGD side's tokens/s over plain Keras and its seconds and updates to
the target over one worker's (``<side>_time_to_target_ratio``; issue 43's DiLoCo goal on
digits is <= 0.6), the machine (CPU model and flags, load average).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from tfdist.bench.harness import cluster_run, common, fits, timing
from tfdist.bench.health.parent import others_per_sample
from tfdist.bench.language_model.worker import TO_TARGET, pipeline_cut, to_target_key
from tfdist.config import check_positive_int, invalid_argument

logger = logging.getLogger(__name__)

DEFAULTS: dict[str, Any] = {
    "model_options": {"width": 64, "depth": 2, "heads": 4},
    "seq_len": 128,
    "global_batch_size": 32,
    "learning_rate": 5e-3,
    "warmup_steps": 50,
    "steps": 20,
    "repeats": 3,
    "steps_per_execution": 1,
    "micro_batches": 4,
    "train_bytes": 8_000_000,
    "validation_bytes": 65_536,
    "target_bits_per_byte": 3.3,
    "eval_every": 50,
    "max_updates": 1500,
    "seed": 0,
    "local_sgd": ("local_sgd_h16", "diloco_h16"),
    "local_sgd_to_target": ("diloco_h16",),
}
# --quick and tests: every process real, the model and text tiny (the figures mean little).
QUICK: dict[str, Any] = {
    "model_options": {"width": 16, "depth": 2, "heads": 2},
    "seq_len": 16,
    "global_batch_size": 8,
    "warmup_steps": 2,
    "steps": 2,
    "repeats": 1,
    "train_bytes": 20_000,
    "validation_bytes": 2_000,
    "target_bits_per_byte": 7.0,
    "eval_every": 4,
    "max_updates": 8,
    "local_sgd": ("diloco_h2",),
    "local_sgd_to_target": ("diloco_h2",),
}
#: Each launch: its worker processes and the strategy they train on.
LAUNCHES = {"1": (1, "local"), "2": (2, "multi_worker")}
#: The goal of the Trainer on one device over plain Keras on one device, tokens/s.
GOAL = ">= 0.95"
#: How the summary names each side.
SIDE_WORDS = {
    "trainer": "Trainer, one device",
    "mirrored": "Trainer, mirrored x2",
    "sharded": "Trainer, mirrored x2, sharding='gradients'",
    "pipeline": "Trainer, 2-stage pipeline",
    "multi_worker": "Trainer, 2 multi_worker processes",
}


def side_words(name: str) -> str:
    """How the summary names a side, local-SGD ones included (``diloco_h16``)."""
    if name in SIDE_WORDS:
        return SIDE_WORDS[name]
    side = fits.local_side(name)
    if side is None:
        return name
    how = "local SGD"
    if side.outer is not None:
        rate, momentum, nesterov = side.outer
        how = f"DiLoCo, outer SGD({rate:g}, {'Nesterov ' * nesterov}momentum {momentum:g})"
    return f"{SIDE_WORDS['multi_worker']}, {how} H={side.sync_every}"


def check(options: dict[str, Any]) -> None:
    """Refuses a bad option, Keras-style, naming it (``local_sgd`` and ``local_sgd_to_target``
    become tuples of `tfdist.bench.harness.fits.LOCAL_SIDE` names)."""
    options["local_sgd"] = fits.check_local_sides(options["local_sgd"])
    options["local_sgd_to_target"] = fits.check_local_sides(options["local_sgd_to_target"])
    counts = ("seq_len", "global_batch_size", "warmup_steps", "steps", "repeats")
    counts += ("steps_per_execution", "micro_batches", "train_bytes", "validation_bytes")
    for key in (*counts, "eval_every", "max_updates"):
        check_positive_int(key, options[key])
    model = options["model_options"]
    if not isinstance(model, dict) or set(model) - {"width", "depth", "heads", "dropout"}:
        raise invalid_argument("model_options", model, "a dict of width, depth, heads, dropout")
    if int(model.get("depth", 0)) < 2:
        raise invalid_argument("model_options", model, "depth >= 2 (a pipeline cut between blocks)")
    batch = options["global_batch_size"]
    if batch % 2 or (batch // 2) % options["micro_batches"]:
        raise invalid_argument(
            "global_batch_size",
            batch,
            f"a multiple of 2 (replicas) whose half is a multiple of micro_batches "
            f"({options['micro_batches']})",
        )
    for key in ("learning_rate", "target_bits_per_byte"):
        value = options[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise invalid_argument(key, value, "a positive number")
    if options["eval_every"] > options["max_updates"]:
        raise invalid_argument(
            "eval_every", options["eval_every"], f"at most max_updates ({options['max_updates']})"
        )


def run(**overrides: Any) -> dict[str, Any]:
    """Runs the benchmark and returns its results (no file written; see ``tfdist bench``).

    Args:
        **overrides: Any key of `DEFAULTS`, e.g. ``steps=10``, ``target_bits_per_byte=2.8``;
            ``quick=True`` applies `QUICK` first.

    Returns:
        ``{"config", "machine", "sides": {name: {"tokens_per_s", ...}}, "to_target": {"1":
        {...}, "2": {...}}, "ratio", "<side>_ratio", "time_to_target_ratio", "goals",
        "words", "others_cpu_max"}``: see docs/benchmarks.md, "A language model".

    Raises:
        ValueError: For a bad option (Keras-style message naming it).
        RuntimeError: If a worker process failed.
    """
    options = cluster_run.merge_options(DEFAULTS, QUICK, overrides)
    check(options)
    spec = {**options, "kind": "language_model", "learning_rate": float(options["learning_rate"])}
    launches = {}
    for key, (workers, strategy) in LAUNCHES.items():
        threads = cluster_run.default_threads(workers)
        logger.info(
            "bench language_model: %d process(es) (%s), %d thread(s) each",
            workers,
            strategy,
            threads,
        )
        launches[key] = cluster_run.run_tasks(
            {
                **spec,
                "strategy": strategy,
                "threads_per_worker": threads,
                # Unpinned, as the one process is: the OS spreads every task over the cores.
                "pin_cores": False,
            },
            workers=workers,
        )
    return summarise(spec, launches)


def side_figures(launched: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each side's tokens/s in one launch: medians over its quiet fits (worker-0's clock)."""
    tasks = launched["tasks"]
    lead = tasks["worker-0"]
    tokens = lead["steps"] * lead["global_batch_size"] * lead["seq_len"]
    others = others_per_sample(tasks, "worker-0")
    rates = {name: [tokens / s for s in seconds] for name, seconds in lead["seconds"].items()}
    busy = {name: [math.nan if o is None else o for o in others[name]] for name in rates}
    samples = timing.Samples(values=rates, cpu_share={n: [] for n in rates}, others_cpu=busy)
    return {
        name: {
            "tokens_per_s": samples.median(name),
            "step_s": timing.median(lead["seconds"][name]) / lead["steps"],
            "quiet_fits": len(samples.clean(name)),
            "tokens_per_s_samples": rates[name],
            "others_cpu": others[name],
            "updates_per_fit": lead["updates"][name],
            "updates_per_worker": {t: r["updates"][name] for t, r in tasks.items()},
        }
        for name in rates
    }


def _run_of(task: dict[str, Any], side: str) -> dict[str, Any]:
    return task["to_target_local_sgd"][side] if side else task["to_target"]


def to_target_figures(launched: dict[str, Any], target: float, side: str = "") -> dict[str, Any]:
    """The run to the target in one launch (``side``: a local-SGD side's, else synchronous):
    seconds (validation excluded) and updates to the first evaluation at or under ``target``
    (None if none was), and every evaluation."""
    tasks = launched["tasks"]
    run = _run_of(tasks["worker-0"], side)
    points = run["points"]
    hit = next((p for p in points if p["val_bits_per_byte"] <= target), None)
    key = to_target_key(side) if side else TO_TARGET
    others = others_per_sample(tasks, "worker-0")[key][0]
    return {
        "reached": hit is not None,
        "seconds_to_target": hit["seconds"] if hit else None,
        "wall_seconds_to_target": hit["wall_seconds"] if hit else None,
        "updates_to_target": hit["updates"] if hit else None,
        "final_val_bits_per_byte": points[-1]["val_bits_per_byte"],
        "updates_run": points[-1]["updates"],
        "eval_seconds": run["eval_seconds"],
        "others_cpu": others,
        # Every worker evaluated the same (all-reduced) bits per byte.
        "val_bits_per_byte_per_worker": {
            t: [p["val_bits_per_byte"] for p in _run_of(r, side)["points"]]
            for t, r in tasks.items()
        },
        "curve": points,
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else timing.ratio(a, b)


def summarise(spec: dict[str, Any], launches: dict[str, Any]) -> dict[str, Any]:
    """The config, the machine, each side's tokens/s and its ratio to plain Keras, the runs to
    the target and their 2 / 1 workers ratios, goals and words."""
    target = float(spec["target_bits_per_byte"])
    sides = {}
    for launched in launches.values():
        sides.update(side_figures(launched))
    reached = {key: to_target_figures(launched, target) for key, launched in launches.items()}
    out: dict[str, Any] = {
        "config": {
            **{k: v for k, v in spec.items() if k != "kind"},
            "pipeline_split_at": pipeline_cut(int(spec["model_options"]["depth"])),
            "launches": {k: {"processes": w, "strategy": s} for k, (w, s) in LAUNCHES.items()},
            "threads": {
                k: launched["tasks"]["worker-0"]["threads"] for k, launched in launches.items()
            },
            "parameters": launches["1"]["tasks"]["worker-0"]["parameters"],
            "tokens_per_update": spec["global_batch_size"] * spec["seq_len"],
        },
        "machine": cluster_run.machine(),
        "sides": sides,
        "to_target": reached,
        "goals": {"ratio": GOAL},
        "words": {},
    }
    keras_rate = sides["keras_fit"]["tokens_per_s"]
    for name in (n for n in sides if n != "keras_fit"):
        key = "ratio" if name == "trainer" else f"{name}_ratio"
        rate = sides[name]["tokens_per_s"]
        out[key] = timing.ratio(rate, keras_rate)
        out["words"][key] = (
            f"{side_words(name)} / Keras model.fit, one device, tokens/s "
            f"({rate:.0f} / {keras_rate:.0f})"
        )
    one, two = reached["1"], reached["2"]
    out["time_to_target_ratio"] = _ratio(two["seconds_to_target"], one["seconds_to_target"])
    out["words"]["time_to_target_ratio"] = (
        f"2 / 1 workers, seconds to {target} val bits per byte ("
        + "; ".join(f"{n}: {_reached_words(r)}" for n, r in (("1", one), ("2", two)))
        + ")"
    )
    out["updates_to_target_ratio"] = _ratio(two["updates_to_target"], one["updates_to_target"])
    out["words"]["updates_to_target_ratio"] = "2 / 1 workers, updates to the target"
    local = local_to_target(spec, launches["2"], out)
    out["others_cpu_max"] = timing.nanmax(
        [o for side in sides.values() for o in side["others_cpu"] if o is not None]
        + [
            r["others_cpu"]
            for r in (*reached.values(), *local.values())
            if r["others_cpu"] is not None
        ]
    )
    return out


def local_to_target(
    spec: dict[str, Any], launched: dict[str, Any], out: dict[str, Any]
) -> dict[str, Any]:
    """Each local-SGD side's run to the target on 2 workers into ``out["to_target_local_sgd"]``,
    with its seconds and updates over one worker's (``<side>_time_to_target_ratio``,
    ``<side>_updates_to_target_ratio``); returns the runs."""
    target = float(spec["target_bits_per_byte"])
    one = out["to_target"]["1"]
    local = {
        side: to_target_figures(launched, target, side)
        for side in launched["tasks"]["worker-0"].get("to_target_local_sgd", {})
    }
    for side, figures in local.items():
        key = f"{side}_time_to_target_ratio"
        out[key] = _ratio(figures["seconds_to_target"], one["seconds_to_target"])
        out["words"][key] = (
            f"{side_words(side)} / 1 worker, seconds to {target} val bits per byte "
            f"({_reached_words(figures)}; 1: {_reached_words(one)})"
        )
        key = f"{side}_updates_to_target_ratio"
        out[key] = _ratio(figures["updates_to_target"], one["updates_to_target"])
        out["words"][key] = f"{side_words(side)} / 1 worker, updates to the target"
    out["to_target_local_sgd"] = local
    return local


def _reached_words(figures: dict[str, Any]) -> str:
    if not figures["reached"]:
        return f"not reached in {figures['updates_run']} updates"
    return f"{figures['seconds_to_target']:.0f} s, {figures['updates_to_target']} updates"


@common.register("language_model")
def language_model(repeats: int, quick: bool) -> dict[str, Any]:
    """The registered benchmark: `run` with the bench's ``--repeats`` and ``--quick``."""
    return run(quick=quick, repeats=repeats)
