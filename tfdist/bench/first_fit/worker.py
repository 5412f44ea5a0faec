"""What each worker of ``tfdist bench --benchmarks=first_fit`` runs (its parent: ``parent.py``).

Both workers of a default 2-worker launch (the launcher has pinned each to its own
cores) make the MultiWorkerMirrored strategy and build the Trainer ``tfdist train``
builds: the digits CNN (``tfdist.models.get("cnn")`` on ``tfdist.data.load("digits")``,
unbound, with fit's ``global_batch_size``), ``metrics=["accuracy"]``, ``tfdist train``'s
``--steps_per_execution`` (its default "auto"), the Trainer's defaults otherwise, and SGD,
so that the raw loop makes the same update. The workers wait for each other (a barrier
through files, no TF) before building the Trainer and before its first fit, so that
neither clock counts the other's slower start. Then, on that one Trainer:

1. ``fits`` fits of ``fit_steps`` steps each, one after another: the first on the fresh
   cluster (tracing and the graph's first run included), the later ones warm. Each fit's
   whole call is timed (what a user waits for), its steps' window apart (first batch to
   the epoch's end), and the optimizer updates it made are counted.
2. The reference: as many fits with Keras's own ``model.fit`` on the same model,
   compiled in the strategy's scope with Keras's defaults (one step per call), timed the
   same way. They run after the Trainer's fits, or before them when ``spec["keras_first"]``
   (the bench alternates the order over launches): the series that runs second does so in
   a process that has paid what it pays once (a first trace and run of any step).
3. A second Trainer with the Trainer's own default, ``steps_per_execution="auto"``, and
   the raw loop (``scaling_sides.raw_loop_side``: SGD steps under ``strategy.run`` in one
   ``tf.function``, one all-reduce a step), on the same model, initial weights, data and
   global batch; all three warmed up untimed, then timed alternately, ``repeats`` rounds
   (A B C, C B A, ...) of ``steps`` steps: each Trainer a fit of ``steps`` steps, its
   steps' window timed (as ``scaling`` times it), the raw loop ``steps`` steps.

Each worker returns its timings, the updates counted and a digest of each side's final
weights (the same on both workers when they trained in lockstep).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import tfdist
from tfdist.bench.harness import fits
from tfdist.bench.harness.worker_common import Recorder, task
from tfdist.bench.scaling.sides import Side, raw_loop_side, time_sides


def weights_digest(weights: list[np.ndarray]) -> str:
    """A short SHA-256 of the weights' bytes: equal on two workers that hold the same model."""
    sha = hashlib.sha256()
    for w in weights:
        sha.update(np.ascontiguousarray(w).tobytes())
    return sha.hexdigest()[:16]


def wait_for_workers(spec: dict[str, Any], name: str, timeout: float = 600.0) -> None:
    """Returns once every worker has reached the point ``name``: a barrier through files.

    The workers start TF and build their models at different speeds; without it the
    first fit of the quicker one would count its wait for the other. Files in
    ``spec["out_dir"]`` (every task runs on this machine) and no TF at all, so that the
    barrier warms nothing up (a collective would).

    Raises:
        TimeoutError: If the other workers do not arrive within ``timeout`` seconds.
    """
    workers = len(json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"])
    _, task_id = task()
    path = os.path.join(spec["out_dir"], f"barrier-{name}-{{}}")
    with open(path.format(task_id), "w"):
        pass
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(path.format(i)) for i in range(workers)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"bench first_fit: the other workers never reached {name!r}")
        time.sleep(0.001)


def make_trainer(
    strategy: Any,
    builder: Callable[[], keras.Model],
    spec: dict[str, Any],
    steps_per_execution: int | str,
) -> Any:
    """The Trainer ``tfdist train`` builds for the digits CNN, with SGD at ``learning_rate``."""
    keras.utils.set_random_seed(int(spec["seed"]))  # the dropout layer's seed
    return tfdist.Trainer(
        builder,
        strategy=strategy,
        optimizer=keras.optimizers.SGD(float(spec["learning_rate"])),
        loss=fits.logits_loss(),
        metrics=["accuracy"],
        steps_per_execution=steps_per_execution,
    )


def time_fits(
    fit: fits.FitThroughput, spec: dict[str, Any], recorder: Recorder, name: str = "fit"
) -> list[dict[str, Any]]:
    """Times ``spec["fits"]`` calls of ``fit`` (each ``spec["fit_steps"]`` steps), in order.

    Returns:
        Per fit: ``seconds`` (the whole ``fit`` call), ``steps_seconds`` (the timing window
        to the epoch's end), ``updates`` (optimizer updates it made).
    """
    out = []
    for _ in range(int(spec["fits"])):
        (_, window), took = recorder.measure(name, fit)
        out.append(
            {"seconds": took.seconds, "steps_seconds": window.seconds, "updates": fit.updates[-1]}
        )
    return out


def trainer_fits(trainer: Any, train: Any, spec: dict[str, Any]) -> fits.FitThroughput:
    """The first fits' measurement on ``trainer``: a whole ``fit`` call of ``fit_steps``."""
    gbs = int(spec["global_batch_size"])
    return fits.FitThroughput(
        lambda **kw: trainer.fit(train, global_batch_size=gbs, **kw),
        steps=int(spec["fit_steps"]),
        global_batch_size=gbs,
        iterations=lambda: int(trainer.model.optimizer.iterations.numpy()),
        from_epoch_begin=True,
    )


def keras_fits(
    strategy: Any, build: Callable[[], keras.Model], train: Any, spec: dict[str, Any]
) -> fits.FitThroughput:
    """The reference: Keras's own ``model.fit`` on the same model, compiled in the strategy's
    scope with Keras's defaults (one step per call), on the same global batches, repeated."""
    gbs = int(spec["global_batch_size"])
    dataset = train.bind(global_batch_size=gbs)(tf.distribute.InputContext()).repeat()
    rate = float(spec["learning_rate"])
    model = fits.compiled_in_scope(
        strategy, build, lambda: keras.optimizers.SGD(rate), ["accuracy"]
    )
    return fits.FitThroughput(
        lambda **kw: model.fit(dataset, shuffle=False, **kw),
        steps=int(spec["fit_steps"]),
        global_batch_size=gbs,
        iterations=lambda: int(model.optimizer.iterations.numpy()),
    )


def trainer_side(trainer: Any, train: Any, gbs: int, steps: int) -> tuple[Side, Any]:
    """The Trainer's side of the alternation (its steps' window timed) and its measurement.

    The measurement (``fits.FitThroughput``) keeps each call's time outside the window.
    """
    throughput = fits.FitThroughput(
        lambda **kw: trainer.fit(train, global_batch_size=gbs, **kw),
        steps=steps,
        global_batch_size=gbs,
        from_epoch_begin=True,
    )
    side = Side(
        lambda n: throughput()[1].seconds,
        lambda: int(trainer.model.optimizer.iterations.numpy()),
        trainer.model.get_weights,
    )
    return side, throughput


def raw_side(
    strategy: Any,
    build: Callable[[], keras.Model],
    weights: list[np.ndarray],
    train: Any,
    gbs: int,
    learning_rate: float,
) -> Side:
    """The raw loop on the Trainer's data: ``train`` bound to ``gbs``, repeated, per pipeline."""
    bound = train.bind(global_batch_size=gbs)
    distributed = strategy.distribute_datasets_from_function(lambda ctx: bound(ctx).repeat())
    return raw_loop_side(
        strategy, build, weights, distributed, global_batch_size=gbs, learning_rate=learning_rate
    )


def steady_sides(
    strategy: Any,
    trainer: Any,
    build: Callable[[], keras.Model],
    weights: list[np.ndarray],
    train: Any,
    spec: dict[str, Any],
) -> tuple[dict[str, Side], dict[str, Any]]:
    """The sides of the alternation, and each Trainer side's measurement (for its overheads).

    ``trainer``: the Trainer of the first fits (``tfdist train``'s one step per call);
    ``trainer_auto``: a second one with the Trainer's own default, ``steps_per_execution=
    "auto"``, from the same initial weights; ``raw_loop``: the raw loop.
    """
    gbs, steps = int(spec["global_batch_size"]), int(spec["steps"])
    auto = make_trainer(strategy, fits.with_weights(build, weights), spec, "auto")
    sides, measurements = {}, {}
    for name, each in (("trainer", trainer), ("trainer_auto", auto)):
        sides[name], measurements[name] = trainer_side(each, train, gbs, steps)
    lr = float(spec["learning_rate"])
    sides["raw_loop"] = raw_side(strategy, build, weights, train, gbs, lr)
    return sides, measurements


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Times the first fits, then the Trainers against the raw loop, on this worker."""
    start = time.perf_counter()
    strategy = tfdist.make_strategy("multi_worker")
    strategy_seconds = time.perf_counter() - start
    seed = int(spec["seed"])
    # Unbound, with fit's global_batch_size, as ``tfdist train`` passes it.
    train = tfdist.data.load("digits", split="train", seed=seed)

    def build() -> keras.Model:
        return tfdist.models.get(
            "cnn", input_shape=train.input_shape, num_classes=train.num_classes
        )

    weights = fits.initial_weights(build, seed)
    recorder = Recorder(planned={"fit": int(spec["fits"]), "keras_fit": int(spec["fits"])})
    wait_for_workers(spec, "trainer")  # the model's variables are broadcast from worker 0
    start = time.perf_counter()
    trainer = make_trainer(
        strategy, fits.with_weights(build, weights), spec, spec["steps_per_execution"]
    )
    trainer_seconds = time.perf_counter() - start
    wait_for_workers(spec, "first_fit")
    series = {
        "fit": trainer_fits(trainer, train, spec),
        "keras_fit": keras_fits(strategy, fits.with_weights(build, weights), train, spec),
    }
    order = ("keras_fit", "fit") if spec.get("keras_first") else ("fit", "keras_fit")
    runs = {name: time_fits(series[name], spec, recorder, name) for name in order}
    sides, measurements = steady_sides(strategy, trainer, build, weights, train, spec)
    seconds, updates = time_sides(sides, recorder, int(spec["steps"]), int(spec["repeats"]))
    return {
        "num_workers": strategy.num_replicas_in_sync,
        "global_batch_size": int(spec["global_batch_size"]),
        "strategy_seconds": strategy_seconds,
        "trainer_build_seconds": trainer_seconds,
        "fits": runs["fit"],
        "keras_fits": runs["keras_fit"],
        "seconds": seconds,
        "updates": updates,
        # Each timed Trainer call's seconds outside its steps' window (the warm-up's left out).
        "call_overhead_seconds": {name: m.overheads[1:] for name, m in measurements.items()},
        "weights_digest": {name: weights_digest(side.weights()) for name, side in sides.items()},
        "is_chief": trainer.is_chief,
        "records": recorder.records,
    }
