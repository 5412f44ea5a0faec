"""The sides a scaling worker times, and the parts of a step timed apart.

Used by ``tfdist.bench.scaling.worker``: the spec's model and data, a
``Side`` for a Trainer's or Keras's ``fit``, the raw ``strategy.run`` loop
(all steps in one ``tf.function``, one all-reduce per step; ``first_fit``
runs it too), ``time_sides`` (the sides timed alternately), and
``split_parts``: a compute-only step (forward, backward and SGD on a local
copy of the model: no all-reduce), an exchange-only step (one all-reduce of
the gradients' bytes, chained from step to step so TF cannot merge them), and
the input pipeline alone (the distributed dataset, nothing else).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import tfdist
from tfdist.bench.harness import fits
from tfdist.bench.harness.timing import Stopwatch
from tfdist.bench.harness.worker_common import Recorder

NUM_BATCHES = 4  # distinct global batches, cached and repeated


def build_model(spec: dict[str, Any]) -> keras.Model:
    return tfdist.models.get(
        "mlp",
        input_shape=(spec["input_dim"],),
        num_classes=spec["num_classes"],
        hidden_units=tuple(spec["hidden_units"]),
        dropout=0.0,
    )


def make_dataset(spec: dict[str, Any], global_batch_size: int) -> tf.data.Dataset:
    """Synthetic global batches; every worker makes the same ones and the strategy splits them."""
    rng = np.random.default_rng(0)
    n = global_batch_size * NUM_BATCHES
    x = rng.normal(size=(n, spec["input_dim"])).astype("float32")
    y = rng.integers(0, spec["num_classes"], size=(n,)).astype("int32")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch_size, drop_remainder=True)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return ds.cache().repeat().with_options(options).prefetch(tf.data.AUTOTUNE)


class Side:
    """One side: ``run(steps)`` trains ``steps`` steps, blocks and returns their wall seconds;
    ``updates()`` counts the optimizer updates made so far; ``weights()``, where given, reads
    the side's model weights (to check that every worker holds the same)."""

    def __init__(
        self,
        run: Callable[[int], float],
        updates: Callable[[], int],
        weights: Callable[[], list[np.ndarray]] | None = None,
    ) -> None:
        self.run, self.updates, self.weights = run, updates, weights


def fit_side(
    fit: Callable[..., Any],
    optimizer: Callable[[], Any],
    steps: int,
    global_batch_size: int,
    *,
    from_epoch_begin: bool = False,
) -> Side:
    """A side that times ``fit(**kw)`` (a Trainer's or Keras's) through ``fits.FitThroughput``.

    ``from_epoch_begin``: for a tfdist Trainer, whose ``steps_per_execution="auto"`` a timing
    callback with a batch hook would turn into one step per call (see ``fits.FitThroughput``).
    """
    throughput = fits.FitThroughput(
        fit, steps=steps, global_batch_size=global_batch_size, from_epoch_begin=from_epoch_begin
    )
    # Only the steps are timed (to the epoch's end), not the iterator's set-up.
    return Side(lambda n: throughput()[1].seconds, lambda: int(optimizer().iterations.numpy()))


def raw_loop_side(
    strategy: tf.distribute.Strategy,
    build: Callable[[], keras.Model],
    weights: list[np.ndarray],
    distributed: Any,
    *,
    global_batch_size: int,
    learning_rate: float,
    compression: str | None = None,
) -> Side:
    """A hand-written loop: SGD, one all-reduce of all gradients a step, all in one tf.function.

    Args:
        strategy: The synchronous strategy it trains under.
        build: Zero-arg model builder, called once in the strategy's scope.
        weights: The weights the model starts from.
        distributed: A distributed dataset of ``(x, y)`` batches that does not run out
            (``strategy.experimental_distribute_dataset`` or
            ``strategy.distribute_datasets_from_function`` of a repeated dataset).
        global_batch_size: Examples per step over all replicas; the loss is divided by it.
        learning_rate: The SGD rate.
        compression: ``"bf16"`` or ``"fp16"`` to all-reduce the gradients in 16 bits.
    """
    with strategy.scope():
        model = build()
        model.set_weights(weights)
        updates = tf.Variable(0, dtype=tf.int64, trainable=False)
    variables = [v.value for v in model.trainable_variables]
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    lr = float(learning_rate)
    wire = {"bf16": tf.bfloat16, "fp16": tf.float16}.get(compression or "")
    iterator = iter(distributed)

    def apply(distribution: tf.distribute.Strategy, grads: list[Any]) -> None:
        for var, grad in zip(variables, grads):
            distribution.extended.update(
                var, lambda v, g: v.assign_sub(lr * g), args=(grad,), group=False
            )
        distribution.extended.update(updates, lambda v: v.assign_add(1), group=False)

    def step(x: tf.Tensor, y: tf.Tensor) -> None:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(loss_fn(y, model(x, training=True))) / global_batch_size
        grads = tape.gradient(loss, variables)
        if wire is not None:
            grads = [tf.cast(g, wire) for g in grads]
        grads = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, grads)
        grads = [tf.cast(g, tf.float32) for g in grads]
        tf.distribute.get_replica_context().merge_call(apply, args=(grads,))

    @tf.function
    def train(steps: tf.Tensor) -> tf.Tensor:
        for _ in tf.range(steps):
            strategy.run(step, args=next(iterator))
        return updates.read_value()

    def run(n: int) -> float:
        watch = Stopwatch()
        watch.start()
        train(tf.constant(n)).numpy()
        return watch.stop().seconds

    return Side(run, lambda: int(updates.numpy()), model.get_weights)


def time_sides(
    sides: dict[str, Side], recorder: Recorder, steps: int, repeats: int
) -> tuple[dict[str, list[float]], dict[str, list[int]]]:
    """Warms every side up, then times them alternately: seconds and updates per measurement.

    Each side first runs ``steps`` steps untimed (traces, fills the dataset cache); then
    ``repeats`` rounds of ``steps`` steps each, in the order A B C, C B A, ..., each
    measurement recorded under the side's name.
    """
    for side in sides.values():
        side.run(steps)
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    updates: dict[str, list[int]] = {name: [] for name in sides}
    for r in range(repeats):
        for name in list(sides) if r % 2 == 0 else list(sides)[::-1]:
            before = sides[name].updates()
            took, _ = recorder.measure(name, lambda s=sides[name]: s.run(steps))
            seconds[name].append(took)
            updates[name].append(sides[name].updates() - before)
    return seconds, updates


def _compute_part(
    local: keras.Model, x: tf.Tensor, y: tf.Tensor, lr: float
) -> Callable[[tf.Tensor], tf.Tensor]:
    """A tf.function of ``steps`` forward, backward and SGD steps on ``local``: no all-reduce."""
    local_vars = local.trainable_variables
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def compute(steps: tf.Tensor) -> tf.Tensor:
        loss = tf.constant(0.0)
        for _ in tf.range(steps):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, local(x, training=True))
            for v, g in zip(local_vars, tape.gradient(loss, local_vars)):
                v.assign_sub(lr * g)
        return loss

    return compute


def _exchange_part(
    strategy: tf.distribute.Strategy, shapes: list[tuple[int, ...]], wire: tf.DType
) -> Callable[[tf.Tensor], tf.Tensor]:
    """A tf.function of ``steps`` chained all-reduces of tensors of ``shapes`` in ``wire``."""

    def one(*tensors: tf.Tensor) -> list[tf.Tensor]:
        # tf.identity in the replica function puts the inputs on the replica's device: made in
        # cross-replica context they have none, and the all-reduce would have no destination.
        placed = [tf.identity(t) for t in tensors]
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, placed)

    @tf.function
    def exchange(steps: tf.Tensor) -> tf.Tensor:
        # Zeros summed stay zeros; each step's input is the previous step's output, so no two
        # all-reduces are the same op on the same input (TF would merge them).
        tensors = [tf.zeros(s, wire) for s in shapes]
        for _ in tf.range(steps):
            tensors = [
                strategy.experimental_local_results(t)[0] for t in strategy.run(one, args=tensors)
            ]
        return tf.add_n([tf.cast(tf.reduce_sum(t), tf.float32) for t in tensors])

    return exchange


def _input_part(
    strategy: tf.distribute.Strategy, dataset: tf.data.Dataset
) -> Callable[[tf.Tensor], tf.Tensor]:
    """A tf.function that reads ``steps`` batches of the distributed dataset, nothing else."""
    iterator = iter(strategy.experimental_distribute_dataset(dataset))

    @tf.function
    def read_input(steps: tf.Tensor) -> tf.Tensor:
        total = tf.constant(0.0)
        for _ in tf.range(steps):
            xb, _ = next(iterator)
            total += strategy.experimental_local_results(xb)[0][0, 0]
        return total

    return read_input


def time_parts(
    parts: dict[str, Callable[[tf.Tensor], tf.Tensor]], recorder: Recorder, steps: int, repeats: int
) -> dict[str, list[float]]:
    """Warms each part of `split_parts` up, then times them alternately.

    Returns:
        Seconds per step of each part, ``repeats`` each.
    """
    for fn in parts.values():
        fn(tf.constant(2)).numpy()  # trace and warm up
    out: dict[str, list[float]] = {name: [] for name in parts}
    for r in range(repeats):
        for name in list(parts) if r % 2 == 0 else list(parts)[::-1]:
            _, took = recorder.measure(
                f"part:{name}", lambda fn=parts[name]: fn(tf.constant(steps)).numpy()
            )
            out[name].append(took.seconds / steps)
    return out


def split_parts(
    strategy: tf.distribute.Strategy,
    spec: dict[str, Any],
    weights: list[np.ndarray],
    dataset: tf.data.Dataset,
    per_worker_batch_size: int,
    compression: str | None,
) -> dict[str, Callable[[tf.Tensor], tf.Tensor]]:
    """A step's compute, gradient exchange and input, each alone: ``fn(steps)`` runs that many.

    `time_parts` times them (as `time_sides` times the sides).
    """
    local = build_model(spec)  # outside the scope: a plain local model, no collectives
    local.set_weights(weights)
    lr = float(spec["learning_rate"])
    rng = np.random.default_rng(1)
    x = tf.constant(rng.normal(size=(per_worker_batch_size, spec["input_dim"])).astype("float32"))
    y = tf.constant(
        rng.integers(0, spec["num_classes"], size=(per_worker_batch_size,)).astype("int32")
    )
    wire = {"bf16": tf.bfloat16, "fp16": tf.float16}.get(compression or "", tf.float32)
    return {
        "compute": _compute_part(local, x, y, lr),
        "exchange": _exchange_part(
            strategy, [tuple(v.shape) for v in local.trainable_variables], wire
        ),
        "input": _input_part(strategy, dataset),
    }
