"""``memory``: what sharded optimizer state, gradients and parameters (ZeRO-1/2/3) save per
worker, and cost.

    tfdist bench --benchmarks=memory --threads_per_worker=1 [--memory_workloads=mlp,gpt]

Two workloads, each with Adam on synthetic data: a 25M-parameter MLP (1024-4096-4096-1024-10)
and a GPT whose parameters dominate its memory (``tfdist.models.gpt``: 8 blocks of width 512,
a vocabulary of 4,096, 32-token windows, 4 per worker and step: 29.4M parameters, the largest
layer 1/14 of them). Each is trained by the Trainer on 1 and 2 MultiWorkerMirrored workers
(real processes on loopback, started by
``tfdist launch`` as ``scaling`` starts them, each with ``threads_per_worker`` threads on
its own core and the same per-worker batch), in four modes: unsharded, ``sharding=
"optimizer"`` (ZeRO-1), ``sharding="gradients"`` (ZeRO-2) and ``sharding="parameters"``
(ZeRO-3). Each mode at each worker
count is a launch of its own, so that no other mode's memory is left in the processes
measured (``tfdist.bench.memory.worker``: the readings and when they are taken; the
allocator counts tensors of 256 KiB and more, which here are nearly all the bytes).

Reported per workload, launch and worker: the bytes each replica holds by kind (``Trainer.
replica_bytes``, from the variables' shapes), the TF CPU allocator's current and peak
bytes, RSS and peak RSS, examples/s (the median over the timed fits, and over those during
which other processes took at most ``timing.BUSY_CPU`` cores: the quiet ones), and a digest
of the final weights; the largest element gap between each mode's final weights and unsharded
training's at the same worker count (a sanity check: they should be equal). Against
unsharded at the same worker count, per mode, with the issue's goals at the most workers:

* optimizer-state bytes per replica: at most 1/N of unsharded plus the blocks' padding
  (and the optimizer's scalars, held whole): the goal's bound is computed from the shapes;
* the allocator's peak over the whole run (the build and warm-up included), on the worker
  with the highest: at most 0.75 for ``"optimizer"``, 0.70 for ``"gradients"`` and, for
  ``"parameters"``, 0.55 on the MLP and 0.45 on the GPT (issue 42's goals, `PEAK_GOALS`);
* examples/s: at least 0.95 (each mode is timed in its own launch, not side by side: the
  medians over the quiet fits when both launches had some, else over all).

And without goals: the allocator's current bytes after the steps, its peak over the timed
steps alone, peak RSS; at fewer workers the peak and examples/s. Then, at the most workers,
each workload's demonstrations under a memory cap (``tfdist.bench.memory.cap``).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
from typing import Any

from tfdist.bench.harness import cluster_run, common, plots, timing
from tfdist.bench.health import parent as health
from tfdist.bench.memory import cap as memory_cap
from tfdist.config import check_positive_int, invalid_argument

logger = logging.getLogger(__name__)

#: The modes, by the name the results use; each one's ``sharding=``.
#: ``"parameters"`` (ZeRO-3) keeps the parameters themselves as blocks (no master shards).
MODES = {
    "unsharded": None,
    "optimizer": "optimizer",
    "gradients": "gradients",
    "parameters": "parameters",
}
#: The workloads, in the order they run: the MLP of ``input_dim``, ``hidden_units`` and
#: ``num_classes``, and the GPT of ``gpt`` (`tfdist.bench.memory.worker.build`).
WORKLOADS = ("mlp", "gpt")
#: The GPT's sizes: its parameters dominate (width 512: a layer's activations are 256 KiB
#: for 128 tokens, its largest weights 8 MiB), and 1/N of them matters.
GPT = {
    "width": 512,
    "depth": 8,
    "heads": 8,
    "vocabulary_size": 4096,
    "seq_len": 32,
    "per_worker_batch_size": 4,
}
DEFAULTS: dict[str, Any] = {
    "workers": (1, 2),
    "workloads": WORKLOADS,
    "threads_per_worker": None,
    "input_dim": 1024,
    "hidden_units": (4096, 4096, 1024),
    "num_classes": 10,
    "per_worker_batch_size": 32,
    "gpt": GPT,
    "warmup_steps": 2,
    "steps": 5,
    "repeats": 3,
    "learning_rate": 1e-3,
    "seed": 0,
    "compare_weights": True,
    # Each workload again under per-worker allocator caps (`memory_cap`).
    "cap": True,
}
# --quick and tests: every process real, the models tiny (the figures mean little).
QUICK: dict[str, Any] = {
    # Tensors the allocator counts (256 KiB and more, see memory_worker), blocks included.
    "input_dim": 256,
    "hidden_units": (1024,),
    "per_worker_batch_size": 8,
    "gpt": {**GPT, "width": 128, "depth": 1, "heads": 2, "vocabulary_size": 512, "seq_len": 8},
    "warmup_steps": 1,
    "steps": 2,
    "repeats": 1,
    "cap": False,  # a tiny model's peaks are too close to show it
}
#: The goals at the most workers (the optimizer state's bound is computed: `state_bound`).
#: Each workload's and mode's goal for its allocator peak over unsharded's, at the most workers.
PEAK_GOALS = {
    "mlp": {"optimizer": "<= 0.75", "gradients": "<= 0.70", "parameters": "<= 0.55"},
    "gpt": {"optimizer": "<= 0.75", "gradients": "<= 0.70", "parameters": "<= 0.45"},
}
RATE_GOAL = ">= 0.95"
#: Each figure against unsharded: its words, and whether fewer workers show it too.
FIGURES = {
    "optimizer_state": ("optimizer-state bytes per replica", False),
    "allocator_peak": ("TF allocator peak per worker (whole run)", True),
    "examples_per_s": ("examples/s", True),
    "allocator_current": ("TF allocator current per worker after the steps", False),
    "allocator_steps_peak": ("TF allocator peak per worker over the timed steps", False),
    "rss_peak": ("peak RSS per worker", False),
}


def _check_gpt(gpt: Any) -> None:
    if not isinstance(gpt, dict) or set(gpt) != set(GPT):
        raise invalid_argument("gpt", gpt, f"a dict of {', '.join(GPT)}")
    for key, value in gpt.items():
        check_positive_int(f"gpt[{key!r}]", value)
    if gpt["width"] % gpt["heads"]:
        raise invalid_argument("gpt", gpt, "a width that is a multiple of heads")


def _check(options: dict[str, Any]) -> None:
    workers = options["workers"]
    if not workers or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in workers):
        raise invalid_argument("workers", list(workers or ()), "worker counts >= 1, e.g. 1,2")
    workloads = options["workloads"]
    if not workloads or isinstance(workloads, str) or set(workloads) - set(WORKLOADS):
        raise invalid_argument("workloads", workloads, f"some of {', '.join(WORKLOADS)}")
    counts = ("per_worker_batch_size", "warmup_steps", "steps", "repeats", "input_dim")
    cluster_run.check_task_options(options, (*counts, "num_classes"))
    hidden = options["hidden_units"]
    if not hidden or any(isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in hidden):
        raise invalid_argument("hidden_units", hidden, "positive layer widths, e.g. (4096, 4096)")
    _check_gpt(options["gpt"])
    rate = options["learning_rate"]
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
        raise invalid_argument("learning_rate", rate, "a positive number")
    if isinstance(options["seed"], bool) or not isinstance(options["seed"], int):
        raise invalid_argument("seed", options["seed"], "an integer")
    for flag in ("cap", "compare_weights"):
        if not isinstance(options[flag], bool):
            raise invalid_argument(flag, options[flag], "True or False")


def workload_spec(spec: dict[str, Any], workload: str) -> dict[str, Any]:
    """The launches' spec of one workload: the GPT's own per-worker batch for the GPT."""
    out = {**spec, "workload": workload}
    if workload == "gpt":
        out["per_worker_batch_size"] = spec["gpt"]["per_worker_batch_size"]
    return out


def run(**overrides: Any) -> dict[str, Any]:
    """Runs the benchmark and returns its results (no file written; see ``tfdist bench``).

    Args:
        **overrides: Any key of `DEFAULTS`, e.g. ``workers=(2,)``, ``workloads=("gpt",)``,
            ``hidden_units=(2048,)``, ``threads_per_worker=1``; ``quick=True`` applies
            `QUICK` first.

    Returns:
        ``{"config", "machine", "workloads": {"mlp": {"per_workers": {"1": {mode: {...}}, ...},
        ...}, "gpt": ...}, "<workload>_<mode>_<n>w_<figure>_ratio", "goals", "words",
        "cap", ...}``: see docs/benchmarks.md, "memory".

    Raises:
        ValueError: For a bad option (Keras-style message naming it).
        RuntimeError: If a worker process failed.
    """
    options = cluster_run.merge_options(DEFAULTS, QUICK, overrides)
    _check(options)
    options["workers"] = tuple(sorted(set(options["workers"])))
    options["workloads"] = tuple(w for w in WORKLOADS if w in options["workloads"])
    threads = options["threads_per_worker"] or cluster_run.default_threads(max(options["workers"]))
    spec = {k: (list(v) if isinstance(v, tuple) else v) for k, v in options.items()}
    spec.update(threads_per_worker=threads, kind="memory", pin_cores=True)
    spec["learning_rate"] = float(spec["learning_rate"])
    runs = {w: launch_modes(workload_spec(spec, w), options) for w in options["workloads"]}
    out = summarise(spec, runs)
    if options["cap"] and max(options["workers"]) > 1:
        out["cap"] = {}
        for workload, (per_workers, _) in runs.items():
            shown = memory_cap.demonstrate(workload_spec(spec, workload), per_workers, workload)
            for key in ("words", "goals"):
                out[key].update(shown.pop(key, {}))
            out["cap"][workload] = shown.pop("cap", {})
            out.update(shown)
    return out


def launch_modes(spec: dict[str, Any], options: dict[str, Any]) -> tuple[dict, dict]:
    """Every mode of ``spec``'s workload at every worker count, a launch each: the launches'
    summaries (``{"N": {mode: ...}}``) and each mode's weight gaps to unsharded's."""
    per_workers: dict[str, Any] = {}
    gaps: dict[str, dict[str, float | None]] = {}
    threads, workload = spec["threads_per_worker"], spec["workload"]
    keep = tempfile.mkdtemp(prefix="tfdist-bench-memory-") if options["compare_weights"] else None
    try:
        for n in options["workers"]:
            per_workers[str(n)] = {}
            for mode, sharding in MODES.items():
                logger.info(
                    "bench memory: %s, %d worker(s), %s, %d thread(s) each",
                    *(workload, n, mode, threads),
                )
                path = os.path.join(keep, f"{n}-{mode}.npz") if keep else None
                each = {**spec, "sharding": sharding, "weights_path": path, "num_pinned_tasks": n}
                launched = cluster_run.run_tasks(each, workers=n)
                per_workers[str(n)][mode] = summarise_launch(launched)
            gaps[str(n)] = weight_gaps(keep, n) if keep else {}
    finally:
        if keep:
            shutil.rmtree(keep, ignore_errors=True)
    return per_workers, gaps


def weight_gaps(directory: str, n: int) -> dict[str, float | None]:
    """Each sharded mode's largest element gap to unsharded's final weights at ``n`` workers."""
    import numpy as np

    def load(mode: str) -> list[Any] | None:
        path = os.path.join(directory, f"{n}-{mode}.npz")
        if not os.path.exists(path):
            return None
        with np.load(path) as f:
            return [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]

    base = load("unsharded")
    out: dict[str, float | None] = {}
    for mode in MODES:
        other = None if mode == "unsharded" or base is None else load(mode)
        if other is not None:
            out[mode] = max(float(np.max(np.abs(a - b))) for a, b in zip(base, other))
    return out


def _worst(tasks: dict[str, Any], reading: str, key: str) -> int | None:
    values = [t["memory"][reading][key] for t in tasks.values()]
    return None if any(v is None for v in values) else max(values)


def summarise_launch(launched: dict[str, Any]) -> dict[str, Any]:
    """One launch (one mode): examples/s, every worker's memory, the worst worker's, the bytes."""
    tasks = launched["tasks"]
    lead = tasks["worker-0"]
    examples = lead["steps"] * lead["global_batch_size"]
    others = health.others_per_sample(tasks, "worker-0").get("steps", [])
    rates = [examples / s for s in lead["seconds"]]
    quiet = [r for r, o in zip(rates, others) if o is None or o <= timing.BUSY_CPU]
    whole_peaks = [
        None if None in peaks else max(peaks)
        for peaks in (
            [t["memory"][r]["allocator_peak"] for r in ("after_warmup", "after_steps")]
            for t in tasks.values()
        )
    ]
    held = lead["replica_bytes"]
    # What a replica keeps from step to step (the gradients are made and freed by each step).
    kept = held["parameters"] + held["optimizer_state"] + held["master_shards"]
    peak = None if None in whole_peaks else max(whole_peaks)
    return {
        "num_workers": len(tasks),
        "global_batch_size": lead["global_batch_size"],
        "parameters": lead["parameters"],
        "examples_per_s": timing.median(rates),
        "quiet_examples_per_s": timing.median(quiet) if quiet else None,
        "step_s": timing.median(lead["seconds"]) / lead["steps"],
        "quiet_measurements": len(quiet),
        "examples_per_s_samples": rates,
        "others_cpu": others,
        "updates_per_worker": {t: r["updates"] for t, r in tasks.items()},
        "replica_bytes": held,
        "kept_bytes": kept,
        "optimizer_variables": {t: r["optimizer_variables"] for t, r in tasks.items()},
        "worst_worker": {
            "allocator_peak": peak,
            # The step's own: gradients, the exchange's buffers, the update's temporaries.
            "allocator_peak_above_kept": None if peak is None else peak - kept,
            "allocator_steps_peak": _worst(tasks, "after_steps", "allocator_peak"),
            "allocator_current": _worst(tasks, "after_steps", "allocator_current"),
            "rss_peak": _worst(tasks, "after_steps", "rss_peak"),
            "rss": _worst(tasks, "after_steps", "rss"),
        },
        "memory_per_worker": {t: r["memory"] for t, r in tasks.items()},
        "weights_digest": {t: r["weights_digest"] for t, r in tasks.items()},
        "threads": {t: r["threads"] for t, r in tasks.items()},
        "others_cpu_whole_launch": launched["others_cpu"],
        "launch_seconds": launched["launch_seconds"],
    }


def state_bound(base: dict[str, Any], sharded: dict[str, Any]) -> float:
    """The goal's bound on sharded / unsharded optimizer-state bytes: the slots cut to the
    blocks (1/N of each variable plus its padding, ``master_shards`` / whole gradients), the
    scalars whole; rounded up at 6 decimals."""
    held, variables = sharded["replica_bytes"], base["optimizer_variables"]["worker-0"]
    whole = base["replica_bytes"]["gradients"]
    # Under "parameters" the blocks are the parameters themselves: its one gradient buffer
    # (this benchmark does not accumulate) has their size.
    cut = held["master_shards"] or held["gradients"]
    blocks = cut / whole if whole else math.nan
    bound = (variables["slots"] * blocks + variables["scalars"]) / (
        variables["slots"] + variables["scalars"]
    )
    return math.ceil(bound * 1e6) / 1e6


def versus(base: dict[str, Any], entry: dict[str, Any]) -> dict[str, float]:
    """Each figure of ``entry`` (one mode's launch) over unsharded's (``base``), same workers.

    Examples/s: the medians over the quiet measurements when both launches had some, else
    over all of them (``examples_per_s_quiet`` says which), so that both sides count alike.
    """
    quiet = entry["quiet_examples_per_s"] is not None and base["quiet_examples_per_s"] is not None
    rate = "quiet_examples_per_s" if quiet else "examples_per_s"
    out = {
        "optimizer_state": timing.ratio(
            entry["replica_bytes"]["optimizer_state"], base["replica_bytes"]["optimizer_state"]
        ),
        "examples_per_s": timing.ratio(entry[rate], base[rate]),
        "examples_per_s_quiet": quiet,
    }
    readings = ("allocator_peak", "allocator_current", "allocator_steps_peak", "rss_peak")
    for key in (*readings, "allocator_peak_above_kept"):
        a, b = entry["worst_worker"][key], base["worst_worker"][key]
        out[key] = math.nan if a is None or b is None else timing.ratio(a, b)
    return out


def ratios(per_workers: dict[str, Any], workload: str) -> dict[str, Any]:
    """One workload's top-level ratios (``<workload>_<mode>_<n>w_<figure>_ratio``), their goals
    (at the most workers) and their words; every figure in ``versus_unsharded``."""
    counts = sorted(int(n) for n in per_workers)
    out: dict[str, Any] = {"goals": {}, "words": {}, "versus_unsharded": {}}
    for n in counts:
        entries = per_workers[str(n)]
        out["versus_unsharded"][str(n)] = {}
        for mode in [m for m in MODES if m != "unsharded" and m in entries]:
            figures = versus(entries["unsharded"], entries[mode])
            out["versus_unsharded"][str(n)][mode] = figures
            for figure, (words, everywhere) in FIGURES.items():
                if n != counts[-1] and not everywhere:
                    continue
                key = f"{workload}_{mode}_{n}w_{figure}_ratio"
                out[key] = figures[figure]
                out["words"][key] = f"{workload}: {mode} / unsharded, {n} worker(s): {words}"
                if n == counts[-1] and n > 1:
                    out["goals"][key] = {
                        "optimizer_state": f"<= {state_bound(entries['unsharded'], entries[mode])}",
                        "allocator_peak": PEAK_GOALS[workload].get(mode),
                        "examples_per_s": RATE_GOAL,
                    }.get(figure)
    out["goals"] = {k: v for k, v in out["goals"].items() if v}
    return out


def summarise_workload(per_workers: dict[str, Any], gaps: dict[str, Any]) -> dict[str, Any]:
    """One workload's launches, each figure against unsharded and the weights' sanity check
    (without the top-level ratios, `ratios`)."""
    lead = next(iter(next(iter(per_workers.values())).values()))
    digests = {
        n: {m: set(e["weights_digest"].values()) for m, e in entries.items()}
        for n, entries in per_workers.items()
    }
    return {
        "parameters": lead["parameters"],
        "per_workers": per_workers,
        "max_weight_gap": gaps,
        # Every worker of a launch ends with the same weights; each mode with unsharded's.
        "workers_agree": {n: {m: len(d) == 1 for m, d in ds.items()} for n, ds in digests.items()},
        "weights_identical": {
            n: {m: d == ds["unsharded"] for m, d in ds.items() if m != "unsharded"}
            for n, ds in digests.items()
        },
    }


def summarise(spec: dict[str, Any], runs: dict[str, tuple[dict, dict]]) -> dict[str, Any]:
    """The config, the machine, each workload's launches (``runs``: ``{workload: (per_workers,
    gaps)}``, `launch_modes`), the ratios with their goals and words."""
    out: dict[str, Any] = {
        "config": {
            **{k: v for k, v in spec.items() if k not in ("kind", "pin_cores")},
            "workloads": list(runs),
            "optimizer": "adam",
            "strategy": "multi_worker",
            "modes": {m: s for m, s in MODES.items()},
        },
        "machine": cluster_run.machine(),
        "workloads": {},
        "goals": {},
        "words": {},
    }
    for workload, (per_workers, gaps) in runs.items():
        one = summarise_workload(per_workers, gaps)
        found = ratios(per_workers, workload)
        for key in ("goals", "words"):
            out[key].update(found.pop(key))
        one["versus_unsharded"] = found.pop("versus_unsharded")
        out["workloads"][workload] = one
        out.update(found)
    out["others_cpu_max"] = timing.nanmax(
        o
        for per_workers, _ in runs.values()
        for entries in per_workers.values()
        for e in entries.values()
        for o in [*e["others_cpu"], e["others_cpu_whole_launch"]]
        if o is not None
    )
    return out


# ``tfdist bench`` flag -> option of `run`.
FLAG_OPTIONS = {"threads_per_worker": "threads_per_worker", "memory_workloads": "workloads"}


@common.register("memory", plot=plots.plot_memory)
def memory(repeats: int, quick: bool) -> dict[str, Any]:
    """The registered benchmark: `run` with the bench's options (``tfdist bench`` flags)."""
    options = {
        FLAG_OPTIONS[k]: v
        for k, v in common.options().items()
        if k in FLAG_OPTIONS and v is not None
    }
    options.setdefault("repeats", repeats)
    return run(quick=quick, **options)
