"""``parameter_server``: Trainer on ParameterServerStrategy vs a hand-written ClusterCoordinator loop.

Both sides run on the same in-process cluster (2 workers, 1 ps; see
``common.strategy("parameter_server")``) through the same
``ClusterCoordinator`` (the one tfdist keeps on the strategy: TF allows one per
strategy), with the same model (``tfdist.models.get("cnn")`` on 8x8x1 inputs,
10 classes) from identical initial weights, the same ``dataset_fn`` (in-memory
examples, repeated, per-replica batches of a global batch of 256), SGD, no
metrics and the same number of steps per timed run:

* **trainer**: ``tfdist.Trainer(...).fit(dataset_fn, epochs=1,
  steps_per_epoch=N, steps_per_execution=1)``, timed from the first batch to
  the epoch's end, which joins the coordinator (see ``fits.FitThroughput``).
  Per call it schedules one step and fetches the logs of calls up to
  ``2 * workers`` behind, so callbacks see real values.
* **hand_written**: the loop of the TF parameter-server tutorial: a
  ``tf.function`` that runs ``strategy.run`` of a GradientTape step
  (``compute_average_loss`` over the global batch, ``optimizer.apply``) on
  ``next(iterator)``; ``coordinator.schedule`` it N times, then
  ``coordinator.join()``; nothing is fetched. Timed from the first schedule to
  the end of the join. Like the Trainer's ``fit``, each run first creates its
  per-worker dataset and iterator, untimed (reported as ``setup_s``).

``ratio`` = trainer / hand-written examples/s, goal >= 0.95. Both schedule one
step per closure; ``steps_per_execution_8`` reports the Trainer with 8 steps
per scheduled closure against the same hand-written loop (a different unit of
scheduling, so no goal). The step counts both sides' optimizers reached are
recorded as a check.

    tfdist bench --benchmarks=parameter_server
"""
from __future__ import annotations

import time
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

from tfdist.bench import common, fits, timing

INPUT_SHAPE = (8, 8, 1)
NUM_CLASSES = 10
GLOBAL_BATCH_SIZE = 256
STEPS_PER_RUN = 64
LEARNING_RATE = 0.01
NUM_BATCHES = 8  # distinct global batches of in-memory data
TRAINER_STEPS_PER_EXECUTION = {"trainer": 1, "trainer_spe8": 8}


def make_dataset_fn(global_batch_size: int, *, num_batches: int = NUM_BATCHES,
                    seed: int = 0) -> Callable[[tf.distribute.InputContext], tf.data.Dataset]:
    """A ``dataset_fn(input_context)`` of repeated per-replica batches of in-memory random examples.

    Each input pipeline (worker) takes its shard of the examples; runs on the
    workers, outside replica context.
    """
    rng = np.random.default_rng(seed)
    n = global_batch_size * num_batches
    x = rng.normal(size=(n, *INPUT_SHAPE)).astype("float32")
    y = rng.integers(0, NUM_CLASSES, size=(n,)).astype("int32")

    def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        per_replica = input_context.get_per_replica_batch_size(global_batch_size)
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        return ds.batch(per_replica, drop_remainder=True).cache().repeat().prefetch(tf.data.AUTOTUNE)

    return dataset_fn


class HandWrittenLoop:
    """A measurement: N steps scheduled one per closure with ``ClusterCoordinator.schedule``, then join.

    The model and optimizer are built in ``strategy.scope()`` (variables on
    the ps tasks); the step is the TF tutorial's, in replica context on a worker.

    Args:
        strategy: A ParameterServerStrategy.
        builder: Zero-arg model builder (loads the initial weights).
        dataset_fn: ``dataset_fn(input_context)`` of per-replica batches.
        global_batch_size: Examples per step over all replicas.
        steps: Steps per measurement.
    """

    def __init__(self, strategy: tf.distribute.Strategy, builder: Callable[[], keras.Model],
                 dataset_fn: Callable[[tf.distribute.InputContext], tf.data.Dataset], *,
                 global_batch_size: int, steps: int) -> None:
        from tfdist.strategies.ps_runner import _coordinator

        self.strategy = strategy
        self.coordinator = _coordinator(strategy)  # TF allows one coordinator per strategy
        self.dataset_fn = dataset_fn
        self.global_batch_size = global_batch_size
        self.steps = steps
        self.setups: list[float] = []
        with strategy.scope():
            self.model = builder()
            self.optimizer = keras.optimizers.SGD(LEARNING_RATE)
            self.optimizer.build(self.model.trainable_variables)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
        model, optimizer = self.model, self.optimizer

        @tf.function
        def step(iterator: Any) -> tf.Tensor:
            def replica(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
                with tf.GradientTape() as tape:
                    per_example = loss_fn(y, model(x, training=True))
                    loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch_size)
                grads = tape.gradient(loss, model.trainable_variables)
                optimizer.apply(grads, model.trainable_variables)
                return loss

            return strategy.run(replica, args=next(iterator))

        self.step = step

    def __call__(self) -> tuple[float, timing.Timing]:
        start = time.perf_counter()
        strategy, dataset_fn = self.strategy, self.dataset_fn
        per_worker = self.coordinator.create_per_worker_dataset(
            lambda: strategy.distribute_datasets_from_function(dataset_fn))
        iterator = iter(per_worker)
        self.setups.append(time.perf_counter() - start)
        watch = timing.Stopwatch()
        watch.start()
        for _ in range(self.steps):
            self.coordinator.schedule(self.step, args=(iterator,))
        self.coordinator.join()
        took = watch.stop()
        return self.steps * self.global_batch_size / took.seconds, took


@common.register("parameter_server", connects_cluster=True)
def parameter_server(repeats: int, quick: bool) -> dict[str, Any]:
    """Trainer vs a hand-written ClusterCoordinator loop on an in-process PS cluster (2 workers, 1 ps), CNN.

    Returns:
        ``trainer_examples_per_s``, ``hand_written_examples_per_s`` (medians),
        ``ratio`` (trainer / hand-written), ``goal``, ``steps_per_execution_8``
        (the Trainer with 8 steps per closure, and its ratio), per-run
        overheads, ``optimizer_steps`` (check), the raw samples and the config.
    """
    import tfdist

    strategy = common.strategy("parameter_server")
    global_batch_size = 32 if quick else GLOBAL_BATCH_SIZE
    steps = 8 if quick else STEPS_PER_RUN
    dataset_fn = make_dataset_fn(global_batch_size)

    def build() -> keras.Model:
        return tfdist.models.get("cnn", input_shape=INPUT_SHAPE, num_classes=NUM_CLASSES)

    builder = fits.with_weights(build, fits.initial_weights(build))
    trainers = {name: tfdist.Trainer(builder, strategy=strategy, optimizer=keras.optimizers.SGD(LEARNING_RATE),
                                     loss=fits.logits_loss(), steps_per_execution=spe)
                for name, spe in TRAINER_STEPS_PER_EXECUTION.items()}
    trainer_sides = {name: fits.trainer_side(trainer, dataset_fn, global_batch_size=global_batch_size, steps=steps)
                     for name, trainer in trainers.items()}
    hand_written = HandWrittenLoop(strategy, builder, dataset_fn, global_batch_size=global_batch_size, steps=steps)
    hand_written()  # warm-up: traces, starts the workers' pipelines
    hand_written.setups.clear()
    sides: dict[str, timing.Side] = {"trainer": trainer_sides["trainer"], "hand_written": hand_written,
                                     "trainer_spe8": trainer_sides["trainer_spe8"]}
    samples = timing.alternate(sides, repeats)
    rates = {name: samples.median(name) for name in sides}
    calls = {name: 1 + len(samples.values[name]) for name in sides}  # + the warm-up
    optimizer_steps = {name: int(trainer.model.optimizer.iterations.numpy()) for name, trainer in trainers.items()}
    optimizer_steps["hand_written"] = int(hand_written.optimizer.iterations.numpy())
    return {
        "trainer_examples_per_s": rates["trainer"],
        "hand_written_examples_per_s": rates["hand_written"],
        "ratio": timing.ratio(rates["trainer"], rates["hand_written"]),
        "goal": ">= 0.95",
        "steps_per_execution_8": {
            "trainer_examples_per_s": rates["trainer_spe8"],
            "ratio": timing.ratio(rates["trainer_spe8"], rates["hand_written"]),
        },
        "fit_overhead_s": {name: timing.median(side.overheads) for name, side in trainer_sides.items()},
        "setup_s": {"hand_written": timing.median(hand_written.setups)},
        "optimizer_steps": {name: {"expected": calls[name] * steps, "counted": optimizer_steps[name]}
                            for name in sides},
        "others_cpu_max": samples.max_others_cpu(),
        "samples": samples.as_dict(),
        "config": {
            "strategy": "parameter_server", "num_workers": common.PS_WORKERS, "num_ps": common.PS_TASKS,
            "num_replicas_in_sync": strategy.num_replicas_in_sync, "model": "cnn",
            "input_shape": list(INPUT_SHAPE), "num_classes": NUM_CLASSES, "global_batch_size": global_batch_size,
            "steps_per_run": steps, "optimizer": f"SGD({LEARNING_RATE})", "metrics": [],
            "trainer_steps_per_execution": dict(TRAINER_STEPS_PER_EXECUTION),
            "hand_written_steps_per_closure": 1,
        },
    }
