"""``parameter_server``: Trainer on ParameterServerStrategy vs hand-written coordinator loops.

All sides run on the same in-process cluster (2 workers, 1 ps; see
``common.strategy("parameter_server")``) through the same
``ClusterCoordinator`` (the one tfdist keeps on the strategy: TF allows one per
strategy), with the same model (``tfdist.models.get("cnn")`` on 8x8x1 inputs,
10 classes) from identical initial weights, the same ``dataset_fn`` (in-memory
examples, repeated, per-replica batches of a global batch of 256), SGD, no
compiled metrics and the same number of steps per timed run:

* **trainer**: ``tfdist.Trainer(...).fit(dataset_fn, epochs=1,
  steps_per_epoch=N, steps_per_execution=1)``, timed from the first batch to
  the epoch's end, which joins the coordinator (see ``fits.FitThroughput``).
  Per call it schedules one step and waits for the call ``2 * workers``
  behind before it calls the batch hooks, as for callbacks that read batch
  logs. Like ``model.fit``, its step also updates Keras's loss tracker (a
  ``Mean`` whose two variables live on the ps): each call adds its sums to
  them, one atomic ``assign_add`` each. No callback here has a batch-end hook
  (``verbose=0``), so the calls return no logs (a fit whose callbacks read
  batch logs gets them back, computed when read: ``tfdist.strategies.ps.logs``).
* **hand_written_bare**: the loop of the TF parameter-server tutorial
  (``tfdist.bench.in_process.ps_hand_written``), with nothing tracked: a ``tf.function``
  that runs ``strategy.run`` of a
  GradientTape step (``compute_average_loss`` over the global batch,
  ``optimizer.apply``) on ``next(iterator)`` and returns the loss;
  ``coordinator.schedule`` it N times, then ``coordinator.join()``; nothing is
  fetched. Timed from the first schedule to the end of the join. Like the
  Trainer's ``fit``, each run first creates its per-worker dataset and
  iterator, untimed (reported as ``setup_s``).
* **hand_written_with_loss_metric**: the same loop, plus mean-loss tracking
  as the tutorial tracks its metrics: a ``keras.metrics.Mean`` created in
  ``strategy.scope()`` (so its variables live on the ps, like the Trainer's
  loss tracker) and updated in the replica function with the batch's loss
  (each step's global batch is one replica's batch here, so that loss is the
  batch mean). The step returns the same loss and nothing else; the metric is
  never read while timing. Every update reaching the ps is checked
  (``loss_metric_updates``).

* **trainer_progress_bar**: the **trainer** side fitted as a user's ``fit``
  is by default, ``verbose=1`` (Keras's progress bar, drawn into a string):
  its calls return their logs, and the bar reads a batch's logs, waiting for
  that call, each time it redraws (at most every 0.05 s).

``ratio`` = trainer / hand_written_bare examples/s, goal >= 0.95;
``ratio_vs_loop_with_loss_metric`` = trainer / hand_written_with_loss_metric
(the loop that does the loss bookkeeping the Trainer does). All sides schedule
one step per closure; ``steps_per_execution_8`` reports the Trainer with 8
steps per scheduled closure against the same hand-written loops (a different
unit of scheduling, so no goal); ``progress_bar`` the Trainer at
``verbose=1``, likewise. The step counts every side's optimizer reached are
recorded as a check.

``cpu_ms_per_step`` is this process's CPU time per step for each side (median
over the same measurements as the rates). The workers and the ps run inside
this process, so it counts all the work of a step (kernels, RPCs, the
coordinator's Python), and it depends far less than wall time on how many
cores the machine lends the process at the moment (on a shared 2-vCPU VM that
swings between about one and two from one measurement to the next, which
moves single wall-time samples by up to 2x). ``cpu_ratio`` =
hand_written_bare / trainer CPU ms per step (higher is better, like
``ratio``): the Trainer's extra work per step. It is a diagnostic, not a
prediction of ``ratio`` (wall time also depends on latency and idle cores);
the goal is about ``ratio``.

    tfdist bench --benchmarks=parameter_server
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras

from tfdist.bench.harness import common, fits, timing
from tfdist.bench.in_process.ps_hand_written import HandWrittenLoop, make_dataset_fn

INPUT_SHAPE = (8, 8, 1)
NUM_CLASSES = 10
GLOBAL_BATCH_SIZE = 256
STEPS_PER_RUN = 64
LEARNING_RATE = 0.01
TRAINER_STEPS_PER_EXECUTION = {"trainer": 1, "trainer_spe8": 8, "trainer_progress_bar": 1}
# The Trainer sides fitted with Keras's progress bar (verbose=1, the default); others verbose=0.
PROGRESS_BAR_SIDES = {"trainer_progress_bar"}
# The hand-written loops: name -> whether the step also tracks the mean loss (keras.metrics.Mean).
HAND_WRITTEN_LOOPS = {"hand_written_bare": False, "hand_written_with_loss_metric": True}


def _cpu_ms_per_step(side: timing.Side, steps: int, into: list[float]) -> timing.Side:
    """Wraps ``side`` to append each measurement's CPU milliseconds per step to ``into``."""

    def measure() -> tuple[float, timing.Timing]:
        value, took = side()
        into.append(took.cpu_seconds / steps * 1000.0)
        return value, took

    return measure


def _clean_median(samples: timing.Samples, name: str, values: list[float]) -> float:
    """The median of ``values`` (one per measurement of ``name``) over those the rates use."""
    clean = [v for v, busy in zip(values, samples.others_cpu[name]) if not busy > timing.BUSY_CPU]
    return timing.median(clean or values)


def _build_cnn() -> keras.Model:
    """The benchmark's model: tfdist's CNN on ``INPUT_SHAPE`` inputs, ``NUM_CLASSES`` classes."""
    import tfdist

    return tfdist.models.get("cnn", input_shape=INPUT_SHAPE, num_classes=NUM_CLASSES)


def _trainers(strategy: Any, builder: Callable[[], keras.Model]) -> dict[str, Any]:
    """A ``tfdist.Trainer`` per entry of ``TRAINER_STEPS_PER_EXECUTION``."""
    import tfdist

    return {
        name: tfdist.Trainer(
            builder,
            strategy=strategy,
            optimizer=keras.optimizers.SGD(LEARNING_RATE),
            loss=fits.logits_loss(),
            steps_per_execution=spe,
        )
        for name, spe in TRAINER_STEPS_PER_EXECUTION.items()
    }


def _warm_loops(
    strategy: Any,
    builder: Callable[[], keras.Model],
    dataset_fn: Callable[..., Any],
    global_batch_size: int,
    steps: int,
) -> dict[str, HandWrittenLoop]:
    """The hand-written loops of ``HAND_WRITTEN_LOOPS``, each run once (untimed) to warm up."""
    loops = {
        name: HandWrittenLoop(
            strategy,
            builder,
            dataset_fn,
            global_batch_size=global_batch_size,
            steps=steps,
            learning_rate=LEARNING_RATE,
            loss_metric=loss_metric,
        )
        for name, loss_metric in HAND_WRITTEN_LOOPS.items()
    }
    for loop in loops.values():
        loop()  # warm-up: traces, starts the workers' pipelines
        loop.setups.clear()
    return loops


def _measure(
    measured: dict[str, timing.Side], steps: int, repeats: int
) -> tuple[timing.Samples, dict[str, float]]:
    """Times the sides alternately: the samples and each side's median CPU ms per step."""
    cpu_ms: dict[str, list[float]] = {name: [] for name in measured}
    sides = {name: _cpu_ms_per_step(side, steps, cpu_ms[name]) for name, side in measured.items()}
    samples = timing.alternate(sides, repeats)
    return samples, {name: _clean_median(samples, name, cpu_ms[name]) for name in sides}


def _rate_summary(rates: dict[str, float]) -> dict[str, Any]:
    """Examples/s per side and the Trainer's ratios to the hand-written loops."""
    bare, with_loss = rates["hand_written_bare"], rates["hand_written_with_loss_metric"]
    return {
        "trainer_examples_per_s": rates["trainer"],
        "hand_written_bare_examples_per_s": bare,
        "hand_written_with_loss_metric_examples_per_s": with_loss,
        "ratio": timing.ratio(rates["trainer"], bare),
        "ratio_vs_loop_with_loss_metric": timing.ratio(rates["trainer"], with_loss),
        "goal": ">= 0.95",
        "steps_per_execution_8": {
            "trainer_examples_per_s": rates["trainer_spe8"],
            "ratio": timing.ratio(rates["trainer_spe8"], bare),
            "ratio_vs_loop_with_loss_metric": timing.ratio(rates["trainer_spe8"], with_loss),
        },
        "progress_bar": {
            "trainer_examples_per_s": rates["trainer_progress_bar"],
            "ratio": timing.ratio(rates["trainer_progress_bar"], bare),
            "ratio_vs_loop_with_loss_metric": timing.ratio(
                rates["trainer_progress_bar"], with_loss
            ),
        },
    }


def _checks(
    samples: timing.Samples, trainers: dict[str, Any], loops: dict[str, HandWrittenLoop], steps: int
) -> dict[str, Any]:
    """The optimizer steps and loss-metric updates each side made, against those expected."""
    calls = {name: 1 + len(values) for name, values in samples.values.items()}  # + the warm-up
    optimizer_steps = {
        name: int(trainer.model.optimizer.iterations.numpy()) for name, trainer in trainers.items()
    }
    optimizer_steps.update(
        {name: int(loop.optimizer.iterations.numpy()) for name, loop in loops.items()}
    )
    metric_loop = loops["hand_written_with_loss_metric"]
    return {
        "optimizer_steps": {
            name: {"expected": calls[name] * steps, "counted": optimizer_steps[name]}
            for name in calls
        },
        "loss_metric_updates": {
            "expected": calls["hand_written_with_loss_metric"] * steps,
            "counted": int(metric_loop.loss_metric.count.numpy()),
        },
    }


def _config(num_replicas_in_sync: int, global_batch_size: int, steps: int) -> dict[str, Any]:
    """The benchmark's configuration, as reported."""
    return {
        "strategy": "parameter_server",
        "num_workers": common.PS_WORKERS,
        "num_ps": common.PS_TASKS,
        "num_replicas_in_sync": num_replicas_in_sync,
        "model": "cnn",
        "input_shape": list(INPUT_SHAPE),
        "num_classes": NUM_CLASSES,
        "global_batch_size": global_batch_size,
        "steps_per_run": steps,
        "optimizer": f"SGD({LEARNING_RATE})",
        "metrics": [],
        "trainer_steps_per_execution": dict(TRAINER_STEPS_PER_EXECUTION),
        "hand_written_steps_per_closure": 1,
        "hand_written_loops": {
            name: {"loss_metric": "keras.metrics.Mean" if flag else None}
            for name, flag in HAND_WRITTEN_LOOPS.items()
        },
    }


@common.register("parameter_server", connects_cluster=True)
def parameter_server(repeats: int, quick: bool) -> dict[str, Any]:
    """Trainer vs hand-written coordinator loops on an in-process PS cluster (2 workers, 1 ps), CNN.

    Returns:
        ``trainer_examples_per_s``, ``hand_written_bare_examples_per_s``,
        ``hand_written_with_loss_metric_examples_per_s`` (medians), ``ratio``
        (trainer / hand_written_bare), ``ratio_vs_loop_with_loss_metric``
        (trainer / hand_written_with_loss_metric), ``goal``,
        ``steps_per_execution_8`` (the Trainer with 8 steps per closure, and its
        ratios), ``cpu_ms_per_step`` and ``cpu_ratio`` (diagnostics), per-run
        overheads, ``optimizer_steps`` and ``loss_metric_updates`` (checks),
        the raw samples and the config.
    """
    strategy = common.strategy("parameter_server")
    global_batch_size = 32 if quick else GLOBAL_BATCH_SIZE
    steps = 8 if quick else STEPS_PER_RUN
    dataset_fn = make_dataset_fn(global_batch_size, INPUT_SHAPE, NUM_CLASSES)
    builder = fits.seeded(_build_cnn)
    trainers = _trainers(strategy, builder)
    trainer_sides = {
        name: fits.trainer_side(
            trainer,
            dataset_fn,
            global_batch_size=global_batch_size,
            steps=steps,
            verbose=int(name in PROGRESS_BAR_SIDES),
        )
        for name, trainer in trainers.items()
    }
    loops = _warm_loops(strategy, builder, dataset_fn, global_batch_size, steps)
    measured: dict[str, timing.Side] = {
        "trainer": trainer_sides["trainer"],
        **loops,
        "trainer_spe8": trainer_sides["trainer_spe8"],
        "trainer_progress_bar": trainer_sides["trainer_progress_bar"],
    }
    samples, cpu_per_step = _measure(measured, steps, repeats)
    return {
        **_rate_summary({name: samples.median(name) for name in measured}),
        "cpu_ms_per_step": cpu_per_step,
        "cpu_ratio": timing.ratio(cpu_per_step["hand_written_bare"], cpu_per_step["trainer"]),
        "fit_overhead_s": {
            name: timing.median(side.overheads) for name, side in trainer_sides.items()
        },
        "setup_s": {name: timing.median(loop.setups) for name, loop in loops.items()},
        **_checks(samples, trainers, loops, steps),
        "others_cpu_max": samples.max_others_cpu(),
        "samples": samples.as_dict(),
        "config": _config(strategy.num_replicas_in_sync, global_batch_size, steps),
    }
