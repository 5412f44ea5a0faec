"""What each task of ``tfdist bench --benchmarks=time_to_accuracy`` runs.

See ``tfdist.bench.time_to_accuracy.parent``. One launch per worker count: 1 task on
``one_device``, or 2 tasks on ``multi_worker`` (MultiWorkerMirroredStrategy
over loopback). Every task runs the spec's benchmark tasks in order (``spec["tasks"]``:
"digits", the digits CNN on scikit-learn's 8x8 digits as ``tfdist train`` builds them;
"patterns", the ``convnet`` on generated 32x32x3 images). For each, and each LR rule, it
builds a fresh ``tfdist.Trainer`` on the task's model and data, from the same initial weights
under the same seed, and fits it with validation on the "validation" split after every epoch
until the validation accuracy reaches the task's target or its ``max_epochs`` have run:

* ``none``: the base learning rate, no warmup (the per-worker batch is fixed, so
  2 workers train on a global batch twice as large at the same rate);
* ``linear``: ``LRScaling("linear", base_global_batch_size=per_worker_batch_size,
  warmup_epochs=...)``: the rate times global batch / per-worker batch (1 on one
  worker, 2 on two), ramped linearly from the base rate over the warmup.

The uneven pair (``spec["uneven"]``, a third launch of 2 workers): worker 1 first starts a
CPU hog pinned to its own core (``tfdist.bench.balance.worker.start_hog``, a noisy neighbour
that leaves it about half its core), and the sides are ``even`` and ``balanced``, both with
the linear rule and ``spec["balance_window"]`` updates per call, ``balanced`` with
``Trainer(balance=BalanceOptions(window=spec["balance_window"]))``. The hog's CPU counts as
its worker's own in the records, so that it does not mark every fit as disturbed.
Local sides on it (``spec["uneven_local_sgd"]``, e.g. ``local_sgd_h16_linear`` against
``local_sgd_h16_linear_adapt``) run as on the 2-worker launch but with ``stragglers=None``,
every one (adapting needs it; the plain side too, so the two differ in adapting alone).

Side ``alone`` (``spec["alone"]``, the 2-worker launch; ``tfdist.bench.time_to_accuracy.alone``):
worker 0 trains the ``none`` side's Trainer on ``one_device`` by itself, at the per-worker
batch, while worker 1 waits without CPU; both re-join through one all-reduce after each fit.

Before each benchmark task's timed fits, one untimed fit of one epoch (a throwaway Trainer),
so that what a process pays once (the collectives' group set-up, kernel caches) does not land
on whichever rule runs first; each timed fit still traces its own functions. With
``repeats`` > 1 the rules alternate (``none linear``, ``linear none``, ...).
"""

from __future__ import annotations

import os
import time
from typing import Any

import keras

import tfdist
from tfdist.bench.balance import worker as balance_worker
from tfdist.bench.harness import fits
from tfdist.bench.harness.worker_common import Recorder, report_progress
from tfdist.bench.time_to_accuracy.alone import SIDE as ALONE
from tfdist.bench.time_to_accuracy.alone import Alone

RULES = ("none", "linear")
#: The uneven pair's sides: the linear rule on the even split, and balanced.
UNEVEN_RULES = ("even", "balanced")


def rules_of(spec: dict[str, Any]) -> tuple[str, ...]:
    """The sides a launch runs: the LR rules (and ``spec["local_sgd"]``'s local-SGD sides, and
    ``alone`` last with ``spec["alone"]``), or on the uneven pair even and balanced (and
    ``spec["uneven_local_sgd"]``'s)."""
    if spec.get("uneven"):
        return UNEVEN_RULES + tuple(spec.get("uneven_local_sgd", ()))
    alone = (ALONE,) if spec.get("alone") else ()  # the 2-worker launch's one worker by itself
    return RULES + tuple(spec.get("local_sgd", ())) + alone  # local SGD's sides, on 2 workers


class AccuracyClock(keras.callbacks.Callback):
    """After every epoch's validation: seconds since ``fit`` was called, and ``val_accuracy``.

    ``seconds`` leaves out the time spent in validation (measured between the
    test hooks ``Trainer.fit`` calls around it), since how often one evaluates is
    the benchmark's choice, not training; ``wall_seconds`` includes it. Asks the
    fit to stop (``model.stop_training``) once ``val_accuracy >= target``; every
    worker sees the same, all-reduced, accuracy. Another ``monitor`` (a ``val_`` log) with
    ``mode="min"`` stops once it is ``<= target`` (``language_model``'s bits per byte).
    A local side adapting to stragglers logs ``local_steps``: this worker's inner steps so far,
    kept per point (a skipped update's batch is read, not trained on).
    """

    def __init__(self, target: float, monitor: str = "val_accuracy", mode: str = "max") -> None:
        super().__init__()
        self.target, self.monitor, self.mode = target, monitor, mode
        self.start = time.perf_counter()
        self.eval_seconds = 0.0
        self.points: list[dict[str, Any]] = []
        self._eval_start = self.start

    def on_test_begin(self, logs: dict | None = None) -> None:
        self._eval_start = time.perf_counter()

    def on_test_end(self, logs: dict | None = None) -> None:
        self.eval_seconds += time.perf_counter() - self._eval_start

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        now = time.perf_counter()
        logs = logs or {}
        accuracy = float(logs[self.monitor])
        optimizer = self.model.optimizer
        self.points.append(
            {
                "epoch": epoch + 1,
                "seconds": now - self.start - self.eval_seconds,
                "wall_seconds": now - self.start,
                self.monitor: accuracy,
                "updates": int(optimizer.iterations.numpy()),
                # The rate the next update would use (the schedule at the current update).
                "learning_rate": float(keras.ops.convert_to_numpy(optimizer.learning_rate)),
                **({"local_steps": int(logs["local_steps"])} if "local_steps" in logs else {}),
            }
        )
        if (accuracy >= self.target) if self.mode == "max" else (accuracy <= self.target):
            self.model.stop_training = True


def scaling_options(rule: str, task: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """The Trainer keywords of LR rule ``rule`` for ``task`` (``"none"``: the Trainer's default)."""
    if rule == "none":
        return {}
    local = fits.local_side(rule)
    if local is not None:  # a local-SGD or DiLoCo option, at the base rate or the linear rule
        linear = scaling_options("linear", task, spec) if local.linear else {}
        # Adapting needs the straggler report off; on the uneven pair every local side runs
        # without it, so that its plain and adapting sides differ in adapting alone.
        quiet = {"stragglers": None} if local.adapt or spec.get("uneven") else {}
        return {"local_sgd": fits.local_sgd_option(rule), **linear, **quiet}
    if rule in UNEVEN_RULES:  # the uneven pair: the linear rule, the split even or balanced
        window = int(spec["balance_window"])
        balance = tfdist.BalanceOptions(window=window) if rule == "balanced" else False
        return {
            **scaling_options("linear", task, spec),
            "balance": balance,
            "steps_per_execution": window,
        }
    return {
        "lr_scaling": tfdist.LRScaling(
            "linear",
            base_global_batch_size=int(task["per_worker_batch_size"]),
            warmup_epochs=float(spec["warmup_epochs"]),
        )
    }


def side_trainer(
    strategy: Any, builder: Any, task: dict[str, Any], spec: dict[str, Any], rule: str
) -> Any:
    """A fresh Trainer of side ``rule`` on ``builder``'s model (the spec's optimizer and rate)."""
    keras.utils.set_random_seed(int(spec["seed"]))  # a dropout layer's seed, as on every side
    optimizer = keras.optimizers.get(
        {"class_name": spec["optimizer"], "config": {"learning_rate": spec["learning_rate"]}}
    )
    options = {"steps_per_execution": spec["steps_per_execution"]}
    options.update(scaling_options(rule, task, spec))
    return tfdist.Trainer(
        builder,
        strategy=strategy,
        optimizer=optimizer,
        loss=fits.logits_loss(),
        metrics=["accuracy"],
        **options,
    )


def fit_to_target(
    trainer: Any,
    data: tuple[Any, Any, int],
    task: dict[str, Any],
    rule: str,
    recorder: Recorder,
    hog_pid: int | None = None,
) -> dict[str, Any]:
    """One timed fit of ``trainer`` (rule ``rule``, fresh weights); its per-epoch points.

    Args:
        data: The train and validation ``DatasetFn``\\ s and the global batch size.
        task: ``name``, ``target_accuracy``, ``max_epochs``; optionally ``steps_per_epoch``
            and ``monitor``, ``(log, "max" or "min")`` (default ``("val_accuracy", "max")``).
        hog_pid: This task's hog, whose CPU in the fit counts as the task's own.
    """
    train, val, global_batch_size = data
    clock = AccuracyClock(float(task["target_accuracy"]), *task.get("monitor", ()))

    def fit() -> None:
        clock.start = time.perf_counter()
        trainer.fit(
            train,
            epochs=int(task["max_epochs"]),
            steps_per_epoch=task.get("steps_per_epoch"),
            global_batch_size=global_batch_size,
            validation_data=val,
            callbacks=[clock],
            verbose=0,
        )

    hog_before = balance_worker.process_cpu_seconds(hog_pid)
    _, took = recorder.measure(f"{task['name']}/{rule}", fit)
    hog_cpu = balance_worker.process_cpu_seconds(hog_pid) - hog_before
    recorder.records[f"{task['name']}/{rule}"][-1]["cpu_seconds"] += hog_cpu
    if clock.points:  # what the fit reached, on the log too (a launch stopped early still tells)
        last = clock.points[-1]
        report_progress(
            f"{task['name']}/{rule}: {last['updates']} updates, {last['epoch']} epochs, "
            f"{clock.monitor} {last[clock.monitor]:.4f}"
        )
    return {
        "points": clock.points,
        "eval_seconds": clock.eval_seconds,
        "fit_seconds": took.seconds,
        "is_chief": trainer.is_chief,
    }


def warm_alone(
    alone: Alone,
    builder: Any,
    data: tuple[Any, Any, int],
    task: dict[str, Any],
    spec: dict[str, Any],
) -> dict[str, Any]:
    """Side ``alone``'s untimed one-epoch fit (worker 0; worker 1 waits); its batch and epoch."""
    train, val, batch = data

    def fit() -> float:
        start = time.perf_counter()
        trainer = side_trainer(alone.one_device(), builder, task, spec, "none")
        trainer.fit(train, epochs=1, global_batch_size=batch, validation_data=val, verbose=0)
        return time.perf_counter() - start

    seconds = alone.run(fit)
    updates = train.bind(global_batch_size=batch).steps_per_epoch()
    return {
        "global_batch_size": batch,
        "updates_per_epoch": updates,
        "examples_per_epoch": updates * batch,
        "untimed_first_fit_seconds": seconds,  # None on the worker that waited
    }


def alone_fit(
    alone: Alone,
    builder: Any,
    data: tuple[Any, Any, int],
    task: dict[str, Any],
    spec: dict[str, Any],
    recorder: Recorder,
) -> list[dict[str, Any]]:
    """One timed fit of side ``alone``: on worker 0 the ``none`` side's Trainer on one_device by
    itself (`fit_to_target`, at the per-worker batch), its run in a list; on worker 1, which
    waits, none."""

    def fit() -> dict[str, Any]:
        trainer = side_trainer(alone.one_device(), builder, task, spec, "none")
        return fit_to_target(trainer, data, task, ALONE, recorder)

    run = alone.run(fit, recorder)
    return [] if run is None else [run]


def run_task(
    strategy: Any,
    task: dict[str, Any],
    spec: dict[str, Any],
    recorder: Recorder,
    hog_pid: int | None = None,
) -> dict[str, Any]:
    """One benchmark task on this process: the untimed fit, then every rule ``repeats`` times."""
    gbs = int(task["per_worker_batch_size"]) * strategy.num_replicas_in_sync
    seed = int(spec["seed"])
    # Unbound, with fit's global_batch_size, as ``tfdist train`` passes them.
    train = tfdist.data.load(task["dataset"], split="train", seed=seed, **task["train_data"])
    val = tfdist.data.load(
        task["dataset"], split="validation", seed=seed, **task["validation_data"]
    )
    updates_per_epoch = train.bind(global_batch_size=gbs).steps_per_epoch()
    builder = fits.seeded(
        lambda: tfdist.models.get(
            task["model"],
            input_shape=train.input_shape,
            num_classes=train.num_classes,
            **task["model_options"],
        ),
        seed,
    )
    rules = rules_of(spec)
    warm = side_trainer(strategy, builder, task, spec, rules[0])
    start = time.perf_counter()
    warm.fit(train, epochs=1, global_batch_size=gbs, validation_data=val, verbose=0)
    warmup_seconds = time.perf_counter() - start
    alone, by_itself = None, {}
    if ALONE in rules:  # worker 0 by itself, at one worker's batch
        alone = Alone(strategy, spec, task["name"], lead=warm.is_chief)
        one = (train, val, int(task["per_worker_batch_size"]))
        by_itself = {"alone": warm_alone(alone, builder, one, task, spec)}
    runs: dict[str, list[dict[str, Any]]] = {rule: [] for rule in rules}
    for r in range(int(spec["repeats"])):
        for rule in rules if r % 2 == 0 else rules[::-1]:
            if rule == ALONE:
                runs[rule] += alone_fit(alone, builder, one, task, spec, recorder)
                continue
            trainer = side_trainer(strategy, builder, task, spec, rule)
            runs[rule].append(
                fit_to_target(trainer, (train, val, gbs), task, rule, recorder, hog_pid)
            )
    return {
        "global_batch_size": gbs,
        "updates_per_epoch": updates_per_epoch,
        "examples_per_epoch": updates_per_epoch * gbs,
        "train_examples": train.num_examples,
        "validation_examples": val.num_examples,
        "untimed_first_fit_seconds": warmup_seconds,
        "parameters": int(warm.model.count_params()),
        # Each local side's bytes per sync, fragment by fragment (its Trainer's cut).
        "fragment_bytes": {
            r: fits.fragment_bytes(warm.model, r) for r in rules if fits.local_side(r)
        },
        "runs": runs,
        "is_chief": warm.is_chief,
        **by_itself,
    }


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Runs every benchmark task of the spec on this task; returns each one's per-epoch points."""
    strategy = tfdist.make_strategy(spec["strategy"])
    recorder = Recorder()
    hog = None
    if spec.get("uneven") and balance_worker.is_slowed(spec):
        hog = balance_worker.start_hog(os.sched_getaffinity(0))
    try:
        pid = None if hog is None else balance_worker.host_pid(hog)
        tasks = {t["name"]: run_task(strategy, t, spec, recorder, pid) for t in spec["tasks"]}
    finally:
        balance_worker.stop_hog(hog)
    return {
        "strategy": spec["strategy"],
        "num_workers": strategy.num_replicas_in_sync,
        "tasks": tasks,
        "records": recorder.records,
        "is_chief": all(t["is_chief"] for t in tasks.values()),
        "hog": hog is not None,
    }
