"""``scaling``: weak scaling over real worker processes, side by side, each step split into parts.

    tfdist bench --benchmarks=scaling --threads_per_worker=1 --repeats=5
    tfdist bench --benchmarks=scaling --gradient_compression=none,bf16

For 1, 2, ... workers (``--scaling_workers``; default 1, 2 and 4, 8, ... up to
the core count), real processes are started by
``tfdist launch`` on loopback ports, each with its threads pinned
(``--threads_per_worker``, default: cores / most workers, the same for every
worker count) and the same per-worker batch (weak scaling). Every worker runs
``tfdist.bench.scaling.worker``: the Trainer, plain Keras ``model.fit`` and a
raw ``strategy.run`` loop, alternately, on the MLP 784-1024-1024-1024-10, synthetic
data, SGD, with Trainer sides on local SGD and DiLoCo (option ``local_sgd``:
``local_sgd_h4``, ``local_sgd_h16``, ``local_sgd_h64``, ``diloco_h16`` by default); then
compute alone, the gradient all-reduce alone and the input pipeline alone. The Trainer
on ``parameter_server`` (1 ps, a chief) runs as well. Reported, per side and worker
count: examples/s (median over the repeats and spread = max/min), efficiency T(N) / (N *
T(1)), and the measured parts of a step; each side's all-reduced bytes per update (a local
side's counted syncs times the parameters' bytes, over its updates: a fit ends on a sync, so
choose ``--scaling_steps`` a multiple of H; a ``_k<K>`` side, streaming DiLoCo's fragments,
counts each sync's fragment's bytes and always ends on a sync: ``bytes_per_sync`` and the
scheduled syncs' ``steady_allreduce_bytes_per_update`` beside), and each local side's
examples/s on the most workers over the synchronous Trainer's on one
(``<side>_vs_one_worker``).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from tfdist.bench.harness import cluster_run, common, fits, plots, timing
from tfdist.config import invalid_argument

logger = logging.getLogger(__name__)

COMPRESSIONS = ("none", "bf16", "fp16")
DEFAULTS: dict[str, Any] = {
    "workers": None,
    "threads_per_worker": None,
    "input_dim": 784,
    "hidden_units": (1024, 1024, 1024),
    "num_classes": 10,
    "per_worker_batch_size": 256,
    "steps": 50,
    "repeats": 5,
    "learning_rate": 0.01,
    "metrics": ("accuracy",),
    "gradient_compression": ("none",),
    "bucket_bytes": None,
    "parameter_server": True,
    "pin_cores": True,
    # Trainer sides on local SGD (every H updates a parameter average) and DiLoCo (the averaged
    # change to an outer Nesterov SGD): ``local_sgd_h<H>``, ``diloco_h<H>``.
    "local_sgd": ("local_sgd_h4", "local_sgd_h16", "local_sgd_h64", "diloco_h16"),
}
# --quick and tests: every process still real, the model tiny.
QUICK: dict[str, Any] = {
    "input_dim": 16,
    "hidden_units": (32,),
    "per_worker_batch_size": 8,
    "steps": 4,
    "repeats": 2,
    "local_sgd": ("diloco_h2",),
}


def _check(options: dict[str, Any]) -> None:
    workers = options["workers"]
    if not workers or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in workers):
        raise invalid_argument("scaling_workers", list(workers), "worker counts >= 1, e.g. 1,2")
    cluster_run.check_task_options(options, ("per_worker_batch_size", "steps", "repeats"))
    for variant in options["gradient_compression"]:
        if variant not in COMPRESSIONS:
            raise invalid_argument("gradient_compression", variant, COMPRESSIONS)
    options["local_sgd"] = fits.check_local_sides(options["local_sgd"])


def run(**overrides: Any) -> dict[str, Any]:
    """Runs the scaling benchmark and returns its results (no file written; see ``tfdist bench``).

    Args:
        **overrides: Any key of `DEFAULTS`, e.g. ``workers=(1, 2)``,
            ``threads_per_worker=1``, ``hidden_units=(64,)``, ``steps=10``,
            ``gradient_compression=("none", "bf16")``; ``quick=True`` applies
            `QUICK` first.

    Returns:
        ``{"config", "machine", "per_workers": {"1": {...}, "2": {...}}, "efficiency",
        "ratio", ...}``: see docs/scaling.md.

    Raises:
        ValueError: For a bad option (Keras-style message naming it).
        RuntimeError: If a worker process failed.
    """
    options = cluster_run.merge_options(DEFAULTS, QUICK, overrides)
    if (
        options["workers"] is None
    ):  # 1, 2, then 4, 8, ... while every worker can have a core of its own
        counts, n = [1, 2], 4
        while n <= cluster_run.cores():
            counts.append(n)
            n *= 2
        options["workers"] = tuple(counts)
    options["workers"] = tuple(sorted(set(options["workers"])))
    options["gradient_compression"] = tuple(options["gradient_compression"])
    _check(options)
    threads = options["threads_per_worker"] or cluster_run.default_threads(max(options["workers"]))
    spec = {k: (list(v) if isinstance(v, tuple) else v) for k, v in options.items()}
    spec.update(threads_per_worker=threads, kind="scaling")
    per_workers: dict[str, Any] = {}
    for n in options["workers"]:
        logger.info("bench scaling: %d worker(s), %d thread(s) each", n, threads)
        launched = cluster_run.run_tasks({**spec, "num_pinned_tasks": n}, workers=n)
        per_workers[str(n)] = summarise(launched, n)
        if options["parameter_server"]:
            logger.info("bench scaling: parameter_server, %d worker(s), 1 ps", n)
            ps_spec = {**spec, "kind": "scaling_ps", "ps_workers": n, "pin_cores": False}
            launched = cluster_run.run_tasks(ps_spec, workers=n, ps=1, chief=True)
            per_workers[str(n)]["sides"].update(summarise(launched, n, task="chief-0")["sides"])
    result = {
        "config": {**spec, "threads_per_worker": threads},
        "machine": cluster_run.machine(),
        "per_workers": per_workers,
    }
    result.update(efficiencies(per_workers))
    result["others_cpu_max"] = timing.nanmax(
        v for entry in per_workers.values() for v in entry["others_cpu"].values() if v is not None
    )
    return result


def _others_cpu(tasks: dict[str, Any], lead: str) -> dict[str, float | None]:
    """Other processes' CPU (cores) in each measurement: machine busy CPU minus every task's own."""
    out: dict[str, float | None] = {}
    for name, records in tasks[lead]["records"].items():
        worst = math.nan
        for i, rec in enumerate(records):
            own = sum(
                t["records"][name][i]["cpu_seconds"]
                for t in tasks.values()
                if name in t.get("records", {})
            )
            if rec["busy_cpu_seconds"] is not None and rec["seconds"] >= 0.25:
                worst = timing.nanmax(
                    [worst, max(rec["busy_cpu_seconds"] - own, 0.0) / rec["seconds"]]
                )
        out[name] = None if math.isnan(worst) else round(worst, 2)
    return out


def summarise(launched: dict[str, Any], n: int, task: str = "worker-0") -> dict[str, Any]:
    """Examples/s (median, spread), updates and step parts of one launch (``task``'s records)."""
    tasks = launched["tasks"]
    lead = tasks[task]
    examples = lead["steps"] * lead["global_batch_size"]
    sides = {}
    for name, seconds in lead["seconds"].items():
        rates = [examples / s for s in seconds]
        sides[name] = {
            "examples_per_s": timing.median(rates),
            "spread": max(rates) / min(rates),
            "step_s": timing.median(seconds) / lead["steps"],
            "examples_per_s_samples": rates,
            "seconds_samples": seconds,
            "steps_per_measurement": lead["steps"],
            "examples_per_measurement": examples,
            "updates_per_measurement": lead["updates"][name],
            # Every worker made the same updates (a collective step cannot run on one alone).
            "updates_per_worker": {
                t: r["updates"][name] for t, r in tasks.items() if "updates" in r
            },
        }
    bytes_per_update(sides, lead, n)
    parts = {}
    for key, measured in lead.get("parts_s_per_step", {}).items():
        med = {part: timing.median(values) for part, values in measured.items()}
        parts[key] = {
            **{f"{part}_s": v for part, v in med.items()},
            "sum_s": sum(med.values()),
            "samples": measured,
        }
    return {
        "num_workers": n,
        "sides": sides,
        "parts": parts,
        "unavailable": lead.get("unavailable", {}),
        "gradient_bytes": lead.get("gradient_bytes"),
        "threads": {t: r["threads"] for t, r in tasks.items()},
        "others_cpu": _others_cpu(tasks, task),
        "others_cpu_whole_launch": launched["others_cpu"],
        "launch_seconds": launched["launch_seconds"],
    }


def bytes_per_update(sides: dict[str, Any], lead: dict[str, Any], n: int) -> None:
    """Each side's ``allreduce_bytes_per_update``: the bytes each worker hands the all-reduce
    per update (a ring all-reduce sends ``2 (N-1) / N`` of them); 0 on one worker. Synchronous
    sides: the gradient's bytes (half in 16 bits); local sides: a parameter average per counted
    sync (with ``_k<K>``: each sync's fragment's bytes, `fits.sync_bytes`), over the updates
    (median over the measurements; ``steady_allreduce_bytes_per_update``: the scheduled syncs'
    only, a fit's end's left out), ``syncs_per_measurement`` and ``bytes_per_sync`` (the
    largest fragment's bytes over the model's: 1.0 without fragments, about ``1/K``)."""
    gradient = lead.get("gradient_bytes")
    if gradient is None:
        return
    for name, side in sides.items():
        if name in lead.get("syncs", {}):
            syncs = lead["syncs"][name]
            side["syncs_per_measurement"] = syncs
            synced = lead.get("sync_bytes", {}).get(name) or [[s * gradient, 0] for s in syncs]
            updates = lead["updates"][name]
            per = [sum(b) / u for b, u in zip(synced, updates)]
            side["allreduce_bytes_per_update"] = timing.median(per) if n > 1 else 0
            # The scheduled syncs only (with fragments a fit's end always syncs K - 1 of them).
            per = [b[0] / u for b, u in zip(synced, updates)]
            side["steady_allreduce_bytes_per_update"] = timing.median(per) if n > 1 else 0
            pieces = lead.get("fragment_bytes", {}).get(name)
            side["bytes_per_sync"] = fits.bytes_per_sync(pieces) if pieces else 1.0
        elif name != "trainer_ps":
            half = name.endswith(("_bf16", "_fp16"))
            side["allreduce_bytes_per_update"] = (gradient // 2 if half else gradient) * (n > 1)


def efficiencies(per_workers: dict[str, Any]) -> dict[str, Any]:
    """Efficiency T(N) / (N * T(1)) per side, and the headline ratios at the most workers."""
    counts = sorted(int(n) for n in per_workers)
    names = sorted({s for entry in per_workers.values() for s in entry["sides"]})
    eff: dict[str, dict[str, float]] = {}
    if 1 in counts:
        for name in names:
            base = per_workers["1"]["sides"].get(name, {}).get("examples_per_s", math.nan)
            eff[name] = {
                str(n): timing.ratio(per_workers[str(n)]["sides"][name]["examples_per_s"], n * base)
                for n in counts
                if name in per_workers[str(n)]["sides"]
            }
    top = per_workers[str(counts[-1])]["sides"]
    rate = lambda name: top.get(name, {}).get("examples_per_s", math.nan)  # noqa: E731
    out: dict[str, Any] = {
        "efficiency": eff,
        "top_workers": counts[-1],
        "ratio": timing.ratio(rate("trainer"), rate("raw_loop")),
        "goal": ">= 0.95",
        "trainer_vs_keras_fit_ratio": timing.ratio(rate("trainer"), rate("keras_fit")),
        "trainer_spread": top.get("trainer", {}).get("spread"),
    }
    for name in names:
        if name in eff and str(counts[-1]) in eff[name] and counts[-1] > 1:
            out[f"{name}_efficiency_ratio"] = eff[name][str(counts[-1])]
    local_headlines(out, per_workers, counts[-1])
    return out


def local_headlines(out: dict[str, Any], per_workers: dict[str, Any], top_count: int) -> None:
    """Local SGD's headlines into ``out``: each local side's examples/s on the most workers
    over the synchronous Trainer's on one (``<side>_vs_one_worker_ratio``; issue 43's goal for
    ``diloco_h16``: >= 1.8) and on as many (``<side>_vs_trainer_ratio``), and its all-reduced
    bytes per update over the synchronous Trainer's (``<side>_bytes_ratio``: goal 1/H within
    5%), with their words and goals (the headline ``ratio``'s goal kept)."""
    top = per_workers[str(top_count)]["sides"]
    one = per_workers.get("1", {}).get("sides", {}).get("trainer", {}).get("examples_per_s")
    sync_bytes = top.get("trainer", {}).get("allreduce_bytes_per_update")
    out.setdefault("words", {})
    out.setdefault("goals", {"ratio": out["goal"]})
    for name, side in sorted(top.items()):
        if not fits.LOCAL_SIDE.fullmatch(name) or not one:
            continue
        key = f"{name}_vs_one_worker_ratio"
        out[key] = timing.ratio(side["examples_per_s"], one)
        out["words"][key] = f"{name}, {top_count} workers / synchronous Trainer on 1, examples/s"
        if name == "diloco_h16":
            out["goals"][key] = ">= 1.8"
        # The same launch, alternated with it: the figure a busy machine moves least.
        key = f"{name}_vs_trainer_ratio"
        out[key] = timing.ratio(side["examples_per_s"], top["trainer"]["examples_per_s"])
        out["words"][key] = f"{name} / synchronous Trainer, {top_count} workers, examples/s"
        local_bytes = side.get("steady_allreduce_bytes_per_update")
        if sync_bytes and local_bytes is not None:
            key = f"{name}_bytes_ratio"
            out[key] = local_bytes / sync_bytes
            out["words"][key] = (
                f"{name} / synchronous Trainer, all-reduced bytes per update, scheduled syncs "
                "(a fit's end's apart: allreduce_bytes_per_update)"
            )
            out["goals"][key] = f"<= {1.05 / fits.local_side(name).sync_every:.4g}"


# ``tfdist bench`` flag -> option of `run`.
FLAG_OPTIONS = {
    "scaling_workers": "workers",
    "threads_per_worker": "threads_per_worker",
    "gradient_compression": "gradient_compression",
    "bucket_bytes": "bucket_bytes",
    "per_worker_batch_size": "per_worker_batch_size",
    "hidden_units": "hidden_units",
    "scaling_steps": "steps",
    "scaling_parameter_server": "parameter_server",
}


@common.register("scaling", plot=plots.plot_scaling)
def scaling(repeats: int, quick: bool) -> dict[str, Any]:
    """The registered benchmark: `run` with the bench's options (``tfdist bench`` flags)."""
    options = {FLAG_OPTIONS[k]: v for k, v in common.options().items() if k in FLAG_OPTIONS}
    options.setdefault("repeats", repeats)
    return run(quick=quick, **options)
