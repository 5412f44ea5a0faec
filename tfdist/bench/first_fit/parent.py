"""``first_fit``: first fits on a fresh cluster; the Trainer against a raw loop; as users launch.

    tfdist bench --benchmarks=first_fit --repeats=3 --first_fit_launches=3

Two MultiWorkerMirrored workers on loopback, started the way a user's default
``tfdist launch --workers=2`` starts them: the launcher pins each worker to its own
cores and sizes its TF thread pools (``tfdist.launch.pinning``); nothing is set by the
bench (``cluster_run.run_tasks(default_launch=True)``). Each worker builds the Trainer
``tfdist train`` builds, the digits CNN at a global batch of 64, with SGD (see
``tfdist.bench.first_fit.worker``), and measures on that one Trainer:

* **the first fits**: ``fits`` fits of ``fit_steps`` (10) steps, one
  after another, the first on the fresh cluster. Reported: the first fit's seconds (the
  whole call: tracing, the graph's first run and the fit's set-up included), the steady
  state (the median of the later fits) and first / steady (goal: at most 1.5); and the same
  for Keras's own ``model.fit`` on the same model (``keras_fit``; Keras's defaults, one step
  per call), in the same launches: what TF's trace and first run cost a fit that has none of
  the Trainer's code. Odd launches fit Keras's model first; each series' figures come from
  the launches where it ran first (from all of them when there were none);
* **the Trainer against a raw loop**: that Trainer (``tfdist train``'s
  ``--steps_per_execution``, by default "auto": 32 steps per call here), a second one with the
  Trainer's own default (``steps_per_execution="auto"``; the two differ when the spec sets
  ``steps_per_execution=1``, say) and a hand-written ``strategy.run`` SGD loop
  (``scaling_sides.raw_loop_side``) on the same model, data and batch, warmed up, then
  timed alternately over ``steps`` steps, ``repeats`` rounds. Reported: examples/s of
  each (medians; a Trainer's window from ``on_epoch_begin``, after its iterator is made, to the
  epoch's end: a batch hook would turn "auto" into one step per call), Trainer / raw loop
  (``ratio``, goal: at least 0.95; ``trainer_auto_ratio``), and the same with each
  Trainer call's own set-up counted.

Each launch (``launches``, default 3) gives one first fit, on a fresh cluster. A
measurement is *quiet* when other processes took at most ``timing.BUSY_CPU`` cores during
it. First fits (of the Trainer, over the launches where it ran first; of Keras, likewise):
the median over the launches whose first fit was quiet, against the
median of those launches' quiet later fits (with no quiet first fit: every launch, every
later fit, so that both sides of the ratio are as disturbed). Sides: medians over the
rounds in which every side was quiet (else over all rounds), the same rounds for each.
"""

from __future__ import annotations

import logging
from typing import Any

from tfdist.bench.harness import cluster_run, common, timing
from tfdist.bench.health import parent as health
from tfdist.config import check_positive_int, check_steps_per_execution, invalid_argument

logger = logging.getLogger(__name__)

WORKERS = 2
#: The Trainer sides: ``tfdist train``'s ``--steps_per_execution`` (its default, "auto", unless
#: the spec says otherwise), and the Trainer's own default, "auto".
TRAINERS = ("trainer", "trainer_auto")
SIDES = (*TRAINERS, "raw_loop")
DEFAULTS: dict[str, Any] = {
    # tfdist train's global batch and steps per call; SGD, so the raw loop makes the same update.
    "global_batch_size": 64,
    "steps_per_execution": "auto",
    "learning_rate": 0.01,
    "fit_steps": 10,
    "fits": 6,
    "steps": 40,
    "repeats": 3,
    "launches": 3,
    "seed": 0,
}
# --quick and tests: every process real, few steps (the figures mean little).
QUICK: dict[str, Any] = {"fit_steps": 2, "fits": 3, "steps": 4, "repeats": 1, "launches": 1}
GOALS = {"ratio": ">= 0.95", "first_to_steady_ratio": "<= 1.5"}


def _check(options: dict[str, Any]) -> None:
    for key in ("global_batch_size", "fit_steps", "steps", "repeats"):
        check_positive_int(key, options[key])
    check_steps_per_execution(options["steps_per_execution"])
    check_positive_int("first_fit_launches", options["launches"])
    fits = options["fits"]
    if isinstance(fits, bool) or not isinstance(fits, int) or fits < 2:
        raise invalid_argument("fits", fits, "an integer >= 2 (the first fit and later ones)")
    if options["global_batch_size"] % WORKERS:
        raise invalid_argument(
            "global_batch_size", options["global_batch_size"], f"a multiple of {WORKERS} workers"
        )
    rate = options["learning_rate"]
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
        raise invalid_argument("learning_rate", rate, "a positive number")


def run(**overrides: Any) -> dict[str, Any]:
    """Runs the benchmark and returns its results (no file written; see ``tfdist bench``).

    Args:
        **overrides: Any key of `DEFAULTS`, e.g. ``launches=5``, ``fits=8``,
            ``repeats=5``; ``quick=True`` applies `QUICK` first.

    Returns:
        ``{"config", "machine", "launches": [...], "first_fit_seconds",
        "steady_fit_seconds", "first_to_steady_ratio", "examples_per_s", "ratio", ...}``:
        see docs/scaling.md, "The first fit".

    Raises:
        ValueError: For a bad option (Keras-style message naming it).
        RuntimeError: If a worker process failed.
    """
    options = cluster_run.merge_options(DEFAULTS, QUICK, overrides)
    _check(options)
    spec = {**options, "learning_rate": float(options["learning_rate"]), "kind": "first_fit"}
    launches = []
    for k in range(options["launches"]):
        logger.info(
            "bench first_fit: launch %d/%d, %d workers as `tfdist launch --workers=%d` starts them",
            k + 1,
            options["launches"],
            WORKERS,
            WORKERS,
        )
        # Odd launches fit Keras's model first: each series gets launches where it runs first.
        each = {**spec, "keras_first": k % 2 == 1}
        launched = cluster_run.run_tasks(each, workers=WORKERS, default_launch=True)
        launches.append(summarise_launch(launched, each))
    return summarise(spec, launches)


def quiet(others: float | None) -> bool:
    """Whether other processes took at most ``timing.BUSY_CPU`` cores (or it is unknown)."""
    return others is None or others <= timing.BUSY_CPU


def _sides(tasks: dict[str, Any], others: dict[str, list[float | None]], examples: int) -> dict:
    """Each side's samples in one launch: worker 0's seconds, rates, every worker's updates."""
    lead = tasks["worker-0"]
    out = {}
    for name in SIDES:
        seconds = lead["seconds"][name]
        out[name] = {
            "seconds_samples": seconds,
            "examples_per_s_samples": [examples / s for s in seconds],
            "updates_per_worker": {t: task["updates"][name] for t, task in tasks.items()},
            "others_cpu": others[name],
        }
    for name in TRAINERS:
        overheads = lead["call_overhead_seconds"][name]
        out[name]["call_examples_per_s_samples"] = [
            examples / (s + o) for s, o in zip(lead["seconds"][name], overheads)
        ]
        out[name]["call_overhead_seconds"] = overheads
    return out


def _fits_of(tasks: dict[str, Any], others: dict[str, Any], key: str, name: str) -> dict:
    """One series of fits in a launch (``key`` in the tasks' results; ``name``: its records)."""
    lead = tasks["worker-0"]
    seconds = [f["seconds"] for f in lead[key]]
    later = timing.median(seconds[1:])
    return {
        "fit_seconds": seconds,
        # Each fit's seconds outside its steps' window: its set-up (and tracing, for the first).
        "fit_outside_steps_seconds": [f["seconds"] - f["steps_seconds"] for f in lead[key]],
        "first_fit_seconds": seconds[0],
        "later_fits_median_seconds": later,
        "first_to_steady": timing.ratio(seconds[0], later),
        "fit_others_cpu": others[name],
        "fits_per_worker": {t: task[key] for t, task in tasks.items()},
    }


def summarise_launch(launched: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """One launch: its fits and Keras's (every worker's, worker 0's clock), its sides' samples."""
    tasks = launched["tasks"]
    lead = tasks["worker-0"]
    others = health.others_per_sample(tasks, "worker-0")
    return {
        **_fits_of(tasks, others, "fits", "fit"),
        "keras_fit": _fits_of(tasks, others, "keras_fits", "keras_fit"),
        "keras_first": bool(spec.get("keras_first")),
        "sides": _sides(tasks, others, int(spec["steps"]) * int(spec["global_batch_size"])),
        "weights_digest": {t: task["weights_digest"] for t, task in tasks.items()},
        "num_workers": lead["num_workers"],
        "global_batch_size": lead["global_batch_size"],
        "chief": [t for t, task in tasks.items() if task.get("is_chief")],
        "strategy_seconds": {t: task["strategy_seconds"] for t, task in tasks.items()},
        "trainer_build_seconds": {t: task["trainer_build_seconds"] for t, task in tasks.items()},
        "threads": {t: task["threads"] for t, task in tasks.items()},
        "others_cpu_whole_launch": launched["others_cpu"],
        "launch_seconds": launched["launch_seconds"],
    }


def quiet_rounds(launches: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """The ``(launch, round)`` pairs in which every side's measurement was quiet, or all of them
    when none was: every side's median then comes from the same rounds."""
    rounds = [
        (k, r)
        for k, entry in enumerate(launches)
        for r in range(len(entry["sides"]["raw_loop"]["others_cpu"]))
    ]
    calm = [
        (k, r)
        for k, r in rounds
        if all(quiet(launches[k]["sides"][name]["others_cpu"][r]) for name in SIDES)
    ]
    return calm or rounds


def _rates(launches: list[dict[str, Any]]) -> dict[str, Any]:
    """Examples/s of every side, the Trainers' with their calls' set-up, and the ratios."""
    rounds = quiet_rounds(launches)

    def samples(name: str, key: str) -> list[float]:
        return [launches[k]["sides"][name][key][r] for k, r in rounds]

    rates = {name: timing.median(samples(name, "examples_per_s_samples")) for name in SIDES}
    calls = {name: timing.median(samples(name, "call_examples_per_s_samples")) for name in TRAINERS}
    raw = rates["raw_loop"]
    return {
        "quiet_rounds": sum(
            all(quiet(launches[k]["sides"][n]["others_cpu"][r]) for n in SIDES) for k, r in rounds
        ),
        "examples_per_s": rates,
        "call_examples_per_s": calls,
        "ratio": timing.ratio(rates["trainer"], raw),
        "trainer_auto_ratio": timing.ratio(rates["trainer_auto"], raw),
        "trainer_call_vs_raw_ratio": timing.ratio(calls["trainer"], raw),
        "trainer_auto_call_vs_raw_ratio": timing.ratio(calls["trainer_auto"], raw),
        # Each round's Trainer / raw loop (measurements next to each other), over those rounds.
        "within_rounds_ratios": {
            name: timing.median(
                [
                    t / r
                    for t, r in zip(
                        samples(name, "examples_per_s_samples"),
                        samples("raw_loop", "examples_per_s_samples"),
                    )
                ]
            )
            for name in TRAINERS
        },
    }


def _fit_figures(launches: list[dict[str, Any]]) -> dict[str, Any]:
    """First and steady fit seconds over the launches whose first fit was quiet (else all).

    Steady: those launches' later fits, the quiet ones when their first fits were quiet
    (when none was, every later fit, as disturbed as the first fits they are compared with).
    """
    chosen = [e for e in launches if quiet(e["fit_others_cpu"][0])]
    first = [e["first_fit_seconds"] for e in chosen or launches]
    later, outside = [], []
    for entry in chosen or launches:
        for f in range(1, len(entry["fit_seconds"])):
            if not chosen or quiet(entry["fit_others_cpu"][f]):
                later.append(entry["fit_seconds"][f])
                outside.append(entry["fit_outside_steps_seconds"][f])
    if chosen and not later:  # no later fit was quiet: all of theirs
        later = [s for e in chosen for s in e["fit_seconds"][1:]]
        outside = [s for e in chosen for s in e["fit_outside_steps_seconds"][1:]]
    first_s, steady_s = timing.median(first), timing.median(later)
    return {
        "quiet_launches": len(chosen),
        "first_fit_seconds": first_s,
        "steady_fit_seconds": steady_s,
        "steady_fit_outside_steps_seconds": timing.median(outside),
        "first_to_steady_ratio": timing.ratio(first_s, steady_s),
    }


def summarise(spec: dict[str, Any], launches: list[dict[str, Any]]) -> dict[str, Any]:
    """The config, the machine, every launch, and the figures over all launches."""
    trainer_first = [e for e in launches if not e["keras_first"]] or launches
    keras_first = [e for e in launches if e["keras_first"]]
    out: dict[str, Any] = {
        "config": {
            **{k: v for k, v in spec.items() if k != "kind"},
            "workers": WORKERS,
            "model": "cnn",
            "dataset": "digits",
            "optimizer": "sgd",
            "launch": "default tfdist launch: each worker pinned by the launcher",
        },
        "machine": cluster_run.machine(),
        "launches": launches,
        **_fit_figures(trainer_first),
        "first_fit_seconds_per_launch": [entry["first_fit_seconds"] for entry in launches],
        "second_fit_seconds_per_launch": [entry["fit_seconds"][1] for entry in launches],
        **_rates(launches),
        "goal": GOALS["ratio"],
        "goals": dict(GOALS),
    }
    out["keras_fit"] = {
        **_fit_figures([entry["keras_fit"] for entry in keras_first or launches]),
        "order": "first in its launches" if keras_first else "after the Trainer's fits",
    }
    out["others_cpu_max"] = timing.nanmax(
        o
        for entry in launches
        for values in (
            entry["fit_others_cpu"],
            entry["keras_fit"]["fit_others_cpu"],
            *(s["others_cpu"] for s in entry["sides"].values()),
        )
        for o in values
        if o is not None
    )
    return out


# ``tfdist bench`` flag -> option of `run`.
FLAG_OPTIONS = {"first_fit_launches": "launches"}


@common.register("first_fit")
def first_fit(repeats: int, quick: bool) -> dict[str, Any]:
    """The registered benchmark: `run` with the bench's options (``tfdist bench`` flags)."""
    options = {FLAG_OPTIONS[k]: v for k, v in common.options().items() if k in FLAG_OPTIONS}
    options.setdefault("repeats", repeats)
    return run(quick=quick, **options)
