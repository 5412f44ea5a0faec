"""``balance``: an uneven pair (a noisy neighbour on one worker), even split against balanced.

    tfdist bench --benchmarks=balance --repeats=3

Two workers, each pinned to its own core, one intra-op thread each; worker 1 starts a CPU
hog (``while True: pass``) pinned to its own core, as a noisy neighbour does, so it keeps
about half its compute (see ``tfdist.bench.balance.worker``). Every side is one launch of
real processes (``tfdist launch``) training the same model on the same global batch for the
same epochs. Two workloads (`WORKLOADS`), each with every side, one after the other:

* ``convnet``: compute-heavy steps (about 100 ms): the ``convnet`` on 32x32x3 inputs (66k
  parameters, so the exchange is small against the compute; ``model="mlp"`` trains a
  1.6M-parameter MLP whose exchange is about a fifth of its step on loopback);
* ``digits``: fast steps (about 16 ms), ``tfdist train --model=cnn --dataset=digits
  --global_batch_size=256 --steps_per_epoch=100 --epochs=10`` as a new user runs it: Adam
  2e-3, ``steps_per_execution="auto"``, the default ``BalanceOptions()``.

The sides:

* ``even``: multi_worker, balance off (every worker takes half of every global batch);
* ``balanced``: multi_worker, ``Trainer(balance=BalanceOptions(window=...))``;
* ``parameter_server`` (on request): the same pair (same hog) as PS workers, a chief and a ps;
* ``even_pair`` and ``balanced_pair``: the same without the hog (balance must not hurt);
* ``even_latency`` and ``balanced_latency``: no hog, but worker 1 sleeps ``latency_ms`` in
  every forward pass, a worker that waits rather than computes (balance must not hurt);
* ``pair_ab`` and ``loaded_ab``, the A/B sides (`tfdist.bench.balance.ab`): one launch each
  that alternates an even and a balanced Trainer's fits (``ab_rounds`` rounds of
  ``ab_epochs`` epochs a fit), without a hog and with a hog on each worker's core (a busy
  host): balance at the even split measured side by side, as separate launches spread more
  than the 2% to be shown.

The sides alternate (A B C, C B A, ...) over ``repeats`` rounds (3 launches a side with
``--repeats=3``). A side's step time is the
median over its steady epochs (the first ``settle_epochs`` are skipped: tracing, and the
balanced split's first windows) that were clean (other processes took at most
``timing.BUSY_CPU`` cores: the machine's busy CPU less the tasks' own and the hog's).

**The ideal** is the global batch over the sum of the two workers' rates, each measured by
the worker itself before its fit, with the hog running: a local copy of the model (no
all-reduce) trains steps of half the global batch, both workers at once. It leaves out the
exchange, which every synchronous side pays; ``ideal.step_s_with_overhead`` adds what the
even pair spends beyond its compute (its step less half the global batch at worker 0's
rate). Per workload (``workloads.<name>``), ``balanced_ratio`` and ``even_ratio`` are step
times over the ideal's (goal: balanced <= 1.15), ``balanced_vs_even_ratio`` balanced over even
under the hog (goal: <= 0.80), ``balanced_ratio_with_overhead`` over the second ideal,
``pair_ratio`` and ``latency_ratio`` balanced over even without the hog and with the delay
(goals: <= 1.02 and <= 1.05), ``pair_changes_per_1000_updates`` how often the even pair's
split changed (goal: <= 2), and per side every launch (``launches``: its steady step, the
fit's seconds, the split's changes, the other processes' CPU). The A/B sides give
``pair_ab_ratio`` (goal: <= 1.02), ``loaded_ab_ratio`` and their ``*_cpu_ratio``,
``pair_ab_changes_per_1000_updates`` and ``loaded_ab_changes_per_1000_updates`` (goals: <= 2),
and the figures read against the host's speed (`ab.ROBUST`): ``*_yard_ratio`` (CPU per update
in yardsticks), ``*_paired_ratio`` (goal on ``pair_ab``: <= 1.02) and ``*_paired_yard_ratio``
(means over adjacent pairs of fits) with their ``*_se``; every launch and fit under
``ab.<side>``.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from tfdist.bench.balance import ab
from tfdist.bench.balance.plot import plot_balance
from tfdist.bench.harness import cluster_run, common, timing
from tfdist.config import check_choice, check_positive_int, invalid_argument

logger = logging.getLogger(__name__)

WORKERS = 2
HOG_WORKER = 1
#: side -> (worker kind, balance on (the A/B kind: both modes, alternated), what slows the
#: workers: "hog" (worker 1), "hogs" (each worker), "latency" (worker 1) or None).
SIDES: dict[str, tuple[str, bool, str | None]] = {
    "even": ("balance", False, "hog"),
    "balanced": ("balance", True, "hog"),
    "parameter_server": ("balance_ps", False, "hog"),
    "even_pair": ("balance", False, None),
    "balanced_pair": ("balance", True, None),
    "even_latency": ("balance", False, "latency"),
    "balanced_latency": ("balance", True, "latency"),
    "pair_ab": ("balance_ab", True, None),
    "loaded_ab": ("balance_ab", True, "hogs"),
}
REQUIRED_SIDES = ("even", "balanced")
#: An A/B launch's timeout (s): its many fits take longer than a side's one (900 s).
AB_TIMEOUT_S = 3600.0
#: The models a side can train: the convnet is compute-bound (66k parameters, a 265 KB
#: exchange against 1.2-2.5 ms of compute per 32x32 example on one core); the MLP's
#: exchange (1.6M parameters, 6.4 MB) is a fifth of its step on loopback; the cnn is
#: ``tfdist train``'s default model on scikit-learn's 8x8 digits (fast steps).
MODELS = ("convnet", "mlp", "cnn")
#: Each workload's options over `DEFAULTS` (the caller's overrides apply to every workload).
WORKLOADS: dict[str, dict[str, Any]] = {
    "convnet": {},
    "digits": {
        "model": "cnn",
        "optimizer": "adam",
        "learning_rate": 2e-3,
        "global_batch_size": 256,
        "steps_per_epoch": 100,
        "epochs": 10,
        "steps_per_execution": "auto",
        "window": 32,
        "settle_epochs": 2,
        "latency_ms": 20.0,
        "rate_steps": 40,
        "ab_rounds": 4,
        "ab_epochs": 4,
    },
}
DEFAULTS: dict[str, Any] = {
    "workloads": tuple(WORKLOADS),
    "sides": tuple(s for s in SIDES if s != "parameter_server"),
    "optimizer": "sgd",
    "threads_per_worker": 1,
    "model": "convnet",
    "image_size": 32,
    "filters": (32, 64),
    "input_dim": 512,
    "hidden_units": (1024, 1024),
    "global_batch_size": 128,
    "num_classes": 10,
    "latency_ms": 60.0,
    "window": 16,
    "steps_per_epoch": 16,
    "steps_per_execution": 8,
    "epochs": 12,
    "settle_epochs": 4,
    "rate_steps": 10,
    "learning_rate": 0.01,
    "ab_rounds": 3,
    "ab_epochs": 8,
    "repeats": 1,
}
QUICK: dict[str, Any] = {
    "workloads": ("convnet",),
    "sides": REQUIRED_SIDES,
    "model": "mlp",
    "global_batch_size": 64,
    "input_dim": 16,
    "hidden_units": (32,),
    "window": 4,
    "steps_per_epoch": 4,
    "steps_per_execution": 2,
    "epochs": 3,
    "settle_epochs": 1,
    "rate_steps": 2,
    "ab_rounds": 1,
    "ab_epochs": 2,
}
COUNTS = ("global_batch_size", "window", "steps_per_epoch", "epochs", "rate_steps", "repeats")
COUNTS += ("ab_rounds", "ab_epochs")
# /proc/stat counts 10 ms ticks: a shorter epoch cannot tell who used the CPU (None: unknown).
MIN_SECONDS_FOR_OTHERS = 0.25
SPLIT = re.compile(r"([\w:.-]+) takes (\d+)")


def check_sides(sides: Any) -> tuple[str, ...]:
    """The sides to run, checked: known names, each once, a comparison among them: ``even``
    and ``balanced``, or an A/B side (``pair_ab``, ``loaded_ab``)."""
    if isinstance(sides, str):
        sides = tuple(s.strip() for s in sides.split(",") if s.strip())
    sides = tuple(sides or ())
    for name in sides:
        if name not in SIDES:
            raise invalid_argument("balance_sides", name, sorted(SIDES))
    missing = [n for n in REQUIRED_SIDES if n not in sides]
    if (missing and not set(sides) & set(ab.SIDES)) or len(set(sides)) != len(sides):
        raise invalid_argument(
            "balance_sides",
            ",".join(sides),
            "distinct side names including even and balanced (the comparison), or an A/B "
            "side (pair_ab, loaded_ab)",
        )
    return sides


def check_workloads(workloads: Any) -> tuple[str, ...]:
    """The workloads to run, checked: known names, at least one, each once."""
    if isinstance(workloads, str):
        workloads = tuple(s.strip() for s in workloads.split(",") if s.strip())
    workloads = tuple(workloads or ())
    for name in workloads:
        check_choice("workloads", name, tuple(WORKLOADS))
    if not workloads or len(set(workloads)) != len(workloads):
        raise invalid_argument("workloads", workloads, f"distinct names from {tuple(WORKLOADS)}")
    return workloads


def _check(options: dict[str, Any]) -> None:
    cluster_run.check_task_options(options, COUNTS)
    if options["steps_per_execution"] != "auto":
        check_positive_int("steps_per_execution", options["steps_per_execution"])
    check_choice("model", options["model"], MODELS)
    check_choice("optimizer", options["optimizer"], ("sgd", "adam"))
    latency = options["latency_ms"]
    if isinstance(latency, bool) or not isinstance(latency, (int, float)) or not latency > 0:
        raise invalid_argument("latency_ms", latency, "a positive number of milliseconds")
    if options["global_batch_size"] % WORKERS:
        raise invalid_argument(
            "global_batch_size", options["global_batch_size"], f"a multiple of {WORKERS}"
        )
    if int(options["ab_epochs"]) < 2:
        raise invalid_argument(
            "ab_epochs", options["ab_epochs"], "at least 2: each fit's first epoch is dropped"
        )
    if not 0 <= int(options["settle_epochs"]) < int(options["epochs"]):
        raise invalid_argument(
            "settle_epochs", options["settle_epochs"], "in [0, epochs): steady epochs must remain"
        )


def parse_split(line: str) -> dict[str, int] | None:
    """``{"worker:0": 83, "worker:1": 45}`` from a ``Balance:`` line, or None for another line."""
    if not line.startswith("Balance:"):
        return None
    found = {label: int(n) for label, n in SPLIT.findall(line)}
    return found or None


def shares_at(splits: Sequence[Mapping[str, Any]], t: float, even: Mapping[str, int]) -> dict:
    """The split in effect at ``t`` seconds: the last ``splits`` line before it, else ``even``."""
    current = dict(even)
    for entry in splits:
        if entry["t"] > t:
            break
        parsed = parse_split(entry["line"])
        if parsed:
            current = parsed
    return current


def epoch_rows(
    tasks: Mapping[str, Any], lead: str, *, steps_per_epoch: int, global_batch_size: int
) -> list[dict[str, Any]]:
    """Per epoch: its end (s from the fit's start), step time, each worker's share, and the CPU
    other processes took (machine busy less every recording task's own and its hog's; None
    under PS, whose serving workers record nothing)."""
    rows = tasks[lead]["epochs"]
    recording = [t for t in tasks.values() if "epochs" in t]
    whole = len(recording) == WORKERS
    even = {f"worker:{i}": global_batch_size // WORKERS for i in range(WORKERS)}
    out = []
    for i in range(1, len(rows)):
        wall = rows[i]["t"] - rows[i - 1]["t"]
        others = None
        busy = [rows[i]["busy_cpu"], rows[i - 1]["busy_cpu"]]
        if whole and None not in busy and wall >= MIN_SECONDS_FOR_OTHERS:
            own = sum(
                t["epochs"][i]["cpu"]
                - t["epochs"][i - 1]["cpu"]
                + t["epochs"][i]["hog_cpu"]
                - t["epochs"][i - 1]["hog_cpu"]
                for t in recording
                if len(t["epochs"]) > i
            )
            others = round(max(busy[0] - busy[1] - own, 0.0) / wall, 2)
        end = rows[i]["t"] - rows[0]["t"]
        out.append(
            {
                "epoch": i,
                "end_s": round(end, 3),
                "step_s": wall / steps_per_epoch,
                "shares": shares_at(tasks[lead].get("splits", []), end, even),
                "others_cpu": others,
            }
        )
    return out


def steady(rows: Sequence[Mapping[str, Any]], settle: int) -> dict[str, Any]:
    """Median step time over the epochs after the first ``settle``, clean ones where any are."""
    after = [r for r in rows if r["epoch"] > settle]
    clean = [r for r in after if r["others_cpu"] is None or r["others_cpu"] <= timing.BUSY_CPU]
    used = clean or after
    return {
        "step_s": timing.median([r["step_s"] for r in used]),
        "epochs_used": len(used),
        "epochs_clean": len(clean),
        "others_cpu_max": timing.nanmax(
            r["others_cpu"] for r in after if r["others_cpu"] is not None
        ),
    }


def ideal(rates: Mapping[str, float], global_batch_size: int) -> dict[str, Any]:
    """The global batch over the sum of the workers' rates (examples/s): its step time."""
    total = sum(rates.values())
    step = global_batch_size / total if total > 0 else math.nan
    return {"step_s": step, "examples_per_s": total, "worker_examples_per_s": dict(rates)}


def summary(
    sides: Mapping[str, Sequence[Mapping[str, Any]]],
    rates: Mapping[str, Sequence[float]],
    global_batch_size: int,
) -> dict[str, Any]:
    """Per side the median of its launches' steady step times; ratios to the ideal (from each
    worker's median rate under the hog) and, on the even pair, balanced over even."""
    out: dict[str, Any] = {"sides": {}}
    for name, launches in sides.items():
        step = timing.median([s["step_s"] for s in launches])
        out["sides"][name] = {
            "step_s": step,
            "examples_per_s": timing.ratio(global_batch_size, step),
            "step_s_samples": [s["step_s"] for s in launches],
        }
    best = ideal({w: timing.median(list(r)) for w, r in rates.items()}, global_batch_size)
    out["ideal"] = best
    step = lambda name: out["sides"].get(name, {}).get("step_s", math.nan)  # noqa: E731
    for name in ("even", "balanced", "parameter_server"):
        if name in out["sides"]:
            out[f"{name}_ratio"] = timing.ratio(step(name), best["step_s"])
    if "even_pair" in out["sides"] and "balanced_pair" in out["sides"]:
        out["pair_ratio"] = timing.ratio(step("balanced_pair"), step("even_pair"))
    if "even_latency" in out["sides"] and "balanced_latency" in out["sides"]:
        out["latency_ratio"] = timing.ratio(step("balanced_latency"), step("even_latency"))
    out["balanced_speedup"] = timing.ratio(step("even"), step("balanced"))
    fast = timing.median(list(rates.get("worker-0", ())))
    if "even_pair" in out["sides"] and fast > 0:
        # What no split removes: the even pair's step less its compute (half the global batch
        # at worker 0's rate, which has no hog in any launch): the exchange and step overhead.
        overhead = max(step("even_pair") - global_batch_size / (WORKERS * fast), 0.0)
        out["ideal"]["overhead_s"] = overhead
        out["ideal"]["step_s_with_overhead"] = best["step_s"] + overhead
        out["balanced_ratio_with_overhead"] = timing.ratio(
            step("balanced"), best["step_s"] + overhead
        )
    _goals(out)
    return out


def _goals(out: dict[str, Any]) -> None:
    """Issue 45's goals and each ratio in words, into ``out``."""
    step = lambda name: out["sides"].get(name, {}).get("step_s", math.nan)  # noqa: E731
    if "even" in out["sides"] and "balanced" in out["sides"]:
        out["balanced_vs_even_ratio"] = timing.ratio(step("balanced"), step("even"))
    out["goals"] = {"balanced_ratio": "<= 1.15", "balanced_vs_even_ratio": "<= 0.80"}
    if "pair_ratio" in out:
        out["goals"]["pair_ratio"] = "<= 1.02"
        out["goals"]["pair_changes_per_1000_updates"] = "<= 2"
    if "latency_ratio" in out:
        out["goals"]["latency_ratio"] = "<= 1.05"
    out["words"] = {
        "even_ratio": "hog on worker 1: even split step time / ideal",
        "balanced_ratio": "hog on worker 1: balanced split step time / ideal",
        "balanced_vs_even_ratio": "hog on worker 1: balanced / even split, step time",
        "balanced_ratio_with_overhead": (
            "hog on worker 1: balanced split step time / (ideal + the even pair's exchange "
            "and step overhead)"
        ),
        "parameter_server_ratio": "hog on worker 1: parameter-server step time / ideal",
        "pair_ratio": "no hog: balanced / even split, step time",
        "pair_changes_per_1000_updates": "no hog: the balanced split's changes per 1,000 updates",
        "latency_ratio": "worker 1 waits a fixed time per update: balanced / even, step time",
    }


def _launch(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    kind, balance, slowdown = SIDES[name]
    task_spec = {**spec, "kind": kind, "balance": balance, "hog": slowdown in ("hog", "hogs")}
    task_spec["hog_all"] = slowdown == "hogs"
    task_spec["latency_s"] = float(spec["latency_ms"]) / 1e3 if slowdown == "latency" else 0.0
    task_spec["pin_cores"] = True
    task_spec["num_pinned_tasks"] = WORKERS
    if kind == "balance_ps":
        launched = cluster_run.run_tasks(task_spec, workers=WORKERS, ps=1, chief=True)
        return {**launched, "lead": "chief-0"}
    timeout = AB_TIMEOUT_S if kind == "balance_ab" else 900.0
    launched = cluster_run.run_tasks(task_spec, workers=WORKERS, timeout=timeout)
    return {**launched, "lead": "worker-0"}


def run(**overrides: Any) -> dict[str, Any]:
    """Runs the balance benchmark; returns its results (see the module's docstring).

    Args:
        **overrides: Any key of `DEFAULTS`, applied over each workload's own options;
            ``quick=True`` applies `QUICK` first.

    Raises:
        ValueError: For a bad option (Keras-style message naming it).
        RuntimeError: If a worker process failed.
    """
    quick = bool(overrides.get("quick", False))
    options = cluster_run.merge_options(DEFAULTS, QUICK, dict(overrides))
    workloads = check_workloads(options["workloads"])
    given = {k: v for k, v in overrides.items() if k != "quick"}
    specs = {}
    for name in workloads:  # every workload checked before the first launch
        merged = {**DEFAULTS, **WORKLOADS[name], **(QUICK if quick else {}), **given}
        _check(merged)
        specs[name] = {**merged, "sides": list(check_sides(merged["sides"]))}
    return headlines({n: run_workload(spec) for n, spec in specs.items()})


#: Each workload's figures that the summary table shows (as ``<workload>_<key>``).
HEADLINES = (
    "even_ratio",
    "balanced_ratio",
    "balanced_vs_even_ratio",
    "pair_ratio",
    "latency_ratio",
    "pair_ab_ratio",
    "pair_ab_cpu_ratio",
    "loaded_ab_ratio",
    "loaded_ab_cpu_ratio",
    "pair_changes_per_1000_updates",
    "pair_ab_changes_per_1000_updates",
    "loaded_ab_changes_per_1000_updates",
) + tuple(f"{side}_{key}" for side in ab.SIDES for key in ab.ROBUST)


def headlines(workloads: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The result: each workload's `HEADLINES` at the top as ``<workload>_<key>`` with their
    goals and words (the summary table reads only top-level goals), and every workload's
    whole result under ``samples.workloads``."""
    out: dict[str, Any] = {"goals": {}, "words": {}}
    for name, result in workloads.items():
        for key in HEADLINES:
            if key in result:
                out[f"{name}_{key}"] = result[key]
                if key in result["goals"]:
                    out["goals"][f"{name}_{key}"] = result["goals"][key]
                out["words"][f"{name}_{key}"] = f"{name}: {result['words'][key]}"
    out["samples"] = {"workloads": dict(workloads)}
    out["machine"] = cluster_run.machine()
    out["others_cpu_max"] = timing.nanmax(w["others_cpu_max"] for w in workloads.values())
    return out


def launch_record(rows: Sequence[Mapping[str, Any]], splits: Sequence[Any], spec: Mapping):
    """One launch in the report: its steady step, the fit's seconds, the split's changes."""
    record = steady(rows, int(spec["settle_epochs"]))
    updates = int(spec["epochs"]) * int(spec["steps_per_epoch"])
    record.update(
        fit_s=rows[-1]["end_s"] if rows else math.nan,
        changes=len(splits),
        changes_per_1000_updates=1000.0 * len(splits) / updates,
    )
    return record


def run_workload(spec: dict[str, Any]) -> dict[str, Any]:
    """One workload's sides, alternated over ``spec["repeats"]`` rounds; its summary."""
    sides = spec["sides"]
    spec = {**spec, "workers": WORKERS, "hog_worker": HOG_WORKER}
    seen: dict[str, dict[str, list[Any]]] = {
        key: {n: [] for n in sides} for key in ("steady", "epochs", "splits", "launch_seconds")
    }
    rates: dict[str, list[float]] = {f"worker-{i}": [] for i in range(WORKERS)}
    for r in range(int(spec["repeats"])):
        for name in sides if r % 2 == 0 else sides[::-1]:
            logger.info(
                "bench balance: %s %s, round %d/%d", spec["model"], name, r + 1, spec["repeats"]
            )
            _record(name, _launch(name, spec), spec, seen, rates)
    return workload_summary(spec, seen, rates)


def _record(name: str, launched: Mapping[str, Any], spec: Mapping, seen: dict, rates: dict):
    """Files one launch of side ``name`` into ``seen`` (and, under the hog, the workers' rates)."""
    tasks = launched["tasks"]
    seen["launch_seconds"][name].append(launched["launch_seconds"])
    if name in ab.SIDES:
        seen["steady"][name].append(ab.launch_record(tasks, int(spec["steps_per_epoch"])))
        return
    rows = epoch_rows(
        tasks,
        launched["lead"],
        steps_per_epoch=int(spec["steps_per_epoch"]),
        global_batch_size=int(spec["global_batch_size"]),
    )
    seen["epochs"][name].append(rows)
    seen["splits"][name].append(tasks[launched["lead"]].get("splits", []))
    seen["steady"][name].append(launch_record(rows, seen["splits"][name][-1], spec))
    if SIDES[name][2] == "hog" and SIDES[name][0] == "balance":  # the hog, on MWMS
        for worker in rates:
            rates[worker].append(tasks[worker]["local_examples_per_s"])


def workload_summary(spec: dict[str, Any], seen: dict, rates: dict) -> dict[str, Any]:
    """One workload's result from its launches (`run_workload`): `summary` of the sides, each
    A/B side's (`ab.side_summary`), every launch."""
    sides = spec["sides"]
    plain = [n for n in sides if n not in ab.SIDES]
    out = summary({n: seen["steady"][n] for n in plain}, rates, int(spec["global_batch_size"]))
    for name in plain:
        out["sides"][name].update(
            launches=seen["steady"][name],
            epochs=seen["epochs"][name],
            splits=seen["splits"][name],
            launch_seconds=seen["launch_seconds"][name],
        )
    if "balanced_pair" in sides:
        out["pair_changes_per_1000_updates"] = timing.median(
            [s["changes_per_1000_updates"] for s in seen["steady"]["balanced_pair"]]
        )
    for name in (n for n in sides if n in ab.SIDES):
        figures = ab.side_summary(name, seen["steady"][name])
        out["goals"].update(figures.pop("goals"))
        out["words"].update(figures.pop("words"))
        out.setdefault("ab", {}).update(figures.pop("ab"))
        out["ab"][name]["launch_seconds"] = seen["launch_seconds"][name]
        out.update(figures)
    out["rates_samples"] = rates
    out["config"] = {k: v for k, v in spec.items() if k != "kind"}
    out["others_cpu_max"] = timing.nanmax(
        s["others_cpu_max"] for launches in seen["steady"].values() for s in launches
    )
    return out


# ``tfdist bench`` flag -> option of `run`.
FLAG_OPTIONS = {"threads_per_worker": "threads_per_worker", "balance_sides": "sides"}


@common.register("balance", plot=plot_balance)
def balance(repeats: int, quick: bool) -> dict[str, Any]:
    """The registered benchmark: `run` with the bench's options (``tfdist bench`` flags)."""
    options = {
        FLAG_OPTIONS[k]: v
        for k, v in common.options().items()
        if k in FLAG_OPTIONS and v is not None
    }
    options.setdefault("repeats", repeats)
    return run(quick=quick, **options)
