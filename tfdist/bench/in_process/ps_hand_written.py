"""The hand-written side of ``tfdist bench --benchmarks=parameter_server``.

The TF parameter-server tutorial's loop, which the Trainer is measured against
(see ``tfdist.bench.in_process.parameter_server``): a GradientTape step in
``strategy.run``, scheduled one per closure with ``ClusterCoordinator.schedule``,
and the in-memory ``dataset_fn`` every side reads.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tfdist.bench.harness import timing

NUM_BATCHES = 8  # distinct global batches of in-memory data


def make_dataset_fn(
    global_batch_size: int,
    input_shape: tuple[int, ...],
    num_classes: int,
    *,
    num_batches: int = NUM_BATCHES,
    seed: int = 0,
) -> Callable[[tf.distribute.InputContext], tf.data.Dataset]:
    """A ``dataset_fn(input_context)`` of repeated per-replica batches of in-memory random examples.

    Each input pipeline (worker) takes its shard of the examples; runs on the
    workers, outside replica context.
    """
    rng = np.random.default_rng(seed)
    n = global_batch_size * num_batches
    x = rng.normal(size=(n, *input_shape)).astype("float32")
    y = rng.integers(0, num_classes, size=(n,)).astype("int32")

    def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        per_replica = input_context.get_per_replica_batch_size(global_batch_size)
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        return (
            ds.batch(per_replica, drop_remainder=True).cache().repeat().prefetch(tf.data.AUTOTUNE)
        )

    return dataset_fn


class HandWrittenLoop:
    """A measurement: N steps scheduled one per closure (``coordinator.schedule``), then a join.

    The model and optimizer are built in ``strategy.scope()`` (variables on
    the ps tasks); the step is the TF tutorial's, in replica context on a worker.

    Args:
        strategy: A ParameterServerStrategy.
        builder: Zero-arg model builder (loads the initial weights).
        dataset_fn: ``dataset_fn(input_context)`` of per-replica batches.
        global_batch_size: Examples per step over all replicas.
        steps: Steps per measurement.
        learning_rate: The SGD learning rate.
        loss_metric: Also track the mean loss in a ``keras.metrics.Mean``
            created in the scope (variables on the ps), updated by every step
            with its batch's loss, as the TF tutorial tracks its metrics. It is
            not read while timing.
    """

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        builder: Callable[[], keras.Model],
        dataset_fn: Callable[[tf.distribute.InputContext], tf.data.Dataset],
        *,
        global_batch_size: int,
        steps: int,
        learning_rate: float,
        loss_metric: bool = False,
    ) -> None:
        from tfdist.strategies.ps.runner import coordinator_for

        self.strategy = strategy
        self.coordinator = coordinator_for(strategy)  # the strategy's one coordinator, shared
        self.dataset_fn = dataset_fn
        self.global_batch_size = global_batch_size
        self.steps = steps
        self.setups: list[float] = []
        with strategy.scope():
            self.model = builder()
            self.optimizer = keras.optimizers.SGD(learning_rate)
            self.optimizer.build(self.model.trainable_variables)
            # The Trainers built first applied tfdist's atomic assign_add shim (tfdist._compat), so
            # this Mean updates its ps variables with the same ops as the Trainer's loss tracker.
            self.loss_metric = keras.metrics.Mean(name="loss") if loss_metric else None
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
        model, optimizer, mean_loss = self.model, self.optimizer, self.loss_metric

        @tf.function
        def step(iterator: Any) -> tf.Tensor:
            def replica(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
                with tf.GradientTape() as tape:
                    per_example = loss_fn(y, model(x, training=True))
                    loss = tf.nn.compute_average_loss(
                        per_example, global_batch_size=global_batch_size
                    )
                grads = tape.gradient(loss, model.trainable_variables)
                optimizer.apply(grads, model.trainable_variables)
                if mean_loss is not None:
                    # One replica per step here, so `loss` is the batch's mean loss.
                    mean_loss.update_state(loss)
                return loss

            return strategy.run(replica, args=next(iterator))

        self.step = step

    def __call__(self) -> tuple[float, timing.Timing]:
        start = time.perf_counter()
        strategy, dataset_fn = self.strategy, self.dataset_fn
        per_worker = self.coordinator.create_per_worker_dataset(
            lambda: strategy.distribute_datasets_from_function(dataset_fn)
        )
        iterator = iter(per_worker)
        self.setups.append(time.perf_counter() - start)
        watch = timing.Stopwatch()
        watch.start()
        for _ in range(self.steps):
            self.coordinator.schedule(self.step, args=(iterator,))
        self.coordinator.join()
        took = watch.stop()
        return self.steps * self.global_batch_size / took.seconds, took
