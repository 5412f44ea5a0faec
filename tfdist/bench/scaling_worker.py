"""What each worker of ``tfdist bench --benchmarks=scaling`` runs (see ``tfdist.bench.scaling``).

Under MultiWorkerMirroredStrategy every worker builds the same sides from the
same initial weights and data: the Trainer (once per gradient-compression
variant), plain Keras ``model.fit`` and a raw ``strategy.run`` loop (all steps
in one ``tf.function``, one all-reduce per step). It times them alternately,
``repeats`` rounds of ``steps`` steps each, counting the optimizer updates
each side really made. Then it measures the parts of a step apart, in the
same process: a compute-only step (forward, backward and SGD on a local copy
of the model: no all-reduce), an exchange-only step (one all-reduce of the
gradients' bytes, chained from step to step so TF cannot merge them), and
the input pipeline alone (the distributed dataset, nothing else).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import tfdist
from tfdist.bench import fits
from tfdist.bench.timing import Stopwatch
from tfdist.bench.workers import Recorder

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


def trainer_kwargs(variant: str | None, bucket_bytes: int | None) -> dict[str, Any] | None:
    """The Trainer keywords of a variant, or None when this Trainer does not take them."""
    params = inspect.signature(tfdist.Trainer.__init__).parameters
    kwargs: dict[str, Any] = {}
    if variant not in (None, "none"):
        if "gradient_compression" not in params:
            return None
        kwargs["gradient_compression"] = variant
    if bucket_bytes is not None:
        if "bucket_bytes" not in params:
            return None
        kwargs["bucket_bytes"] = bucket_bytes
    return kwargs


class Side:
    """One side: ``run(steps)`` trains ``steps`` steps, blocks and returns their wall seconds;
    ``updates()`` counts the optimizer updates made so far."""

    def __init__(self, run: Callable[[int], float], updates: Callable[[], int]) -> None:
        self.run, self.updates = run, updates


def _fit_side(
    fit: Callable[..., Any], optimizer: Callable[[], Any], steps: int, global_batch_size: int
) -> Side:
    throughput = fits.FitThroughput(fit, steps=steps, global_batch_size=global_batch_size)
    # Only the steps are timed (first batch's start to the epoch's end), not the iterator's set-up.
    return Side(lambda n: throughput()[1].seconds, lambda: int(optimizer().iterations.numpy()))


def raw_loop_side(
    strategy: tf.distribute.Strategy,
    spec: dict[str, Any],
    weights: list[np.ndarray],
    dataset: tf.data.Dataset,
    global_batch_size: int,
    compression: str | None,
) -> Side:
    """A hand-written loop: SGD, one all-reduce of all gradients per step, all steps in one tf.function."""
    with strategy.scope():
        model = build_model(spec)
        model.set_weights(weights)
        updates = tf.Variable(0, dtype=tf.int64, trainable=False)
    variables = [v.value for v in model.trainable_variables]
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    lr = float(spec["learning_rate"])
    wire = {"bf16": tf.bfloat16, "fp16": tf.float16}.get(compression or "")
    iterator = iter(strategy.experimental_distribute_dataset(dataset))

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

    return Side(run, lambda: int(updates.numpy()))


def split_parts(
    strategy: tf.distribute.Strategy,
    spec: dict[str, Any],
    weights: list[np.ndarray],
    dataset: tf.data.Dataset,
    per_worker_batch_size: int,
    compression: str | None,
    recorder: Recorder,
    steps: int,
    repeats: int,
) -> dict[str, list[float]]:
    """Seconds per step of compute alone, gradient exchange alone and input alone (``repeats`` each)."""
    local = build_model(spec)  # outside the scope: a plain local model, no collectives
    local.set_weights(weights)
    local_vars = local.trainable_variables
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    lr = float(spec["learning_rate"])
    rng = np.random.default_rng(1)
    x = tf.constant(rng.normal(size=(per_worker_batch_size, spec["input_dim"])).astype("float32"))
    y = tf.constant(
        rng.integers(0, spec["num_classes"], size=(per_worker_batch_size,)).astype("int32")
    )

    @tf.function
    def compute(steps: tf.Tensor) -> tf.Tensor:
        loss = tf.constant(0.0)
        for _ in tf.range(steps):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, local(x, training=True))
            for v, g in zip(local_vars, tape.gradient(loss, local_vars)):
                v.assign_sub(lr * g)
        return loss

    wire = {"bf16": tf.bfloat16, "fp16": tf.float16}.get(compression or "", tf.float32)
    shapes = [tuple(v.shape) for v in local_vars]

    @tf.function
    def exchange(steps: tf.Tensor) -> tf.Tensor:
        def one(*tensors: tf.Tensor) -> list[tf.Tensor]:
            # tf.identity in the replica function puts the inputs on the replica's device: made in
            # cross-replica context they have none, and the all-reduce would have no destination.
            placed = [tf.identity(t) for t in tensors]
            return tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, placed
            )

        # Zeros summed stay zeros; each step's input is the previous step's output, so no two
        # all-reduces are the same op on the same input (TF would merge them).
        tensors = [tf.zeros(s, wire) for s in shapes]
        for _ in tf.range(steps):
            tensors = [
                strategy.experimental_local_results(t)[0] for t in strategy.run(one, args=tensors)
            ]
        return tf.add_n([tf.cast(tf.reduce_sum(t), tf.float32) for t in tensors])

    iterator = iter(strategy.experimental_distribute_dataset(dataset))

    @tf.function
    def read_input(steps: tf.Tensor) -> tf.Tensor:
        total = tf.constant(0.0)
        for _ in tf.range(steps):
            xb, _ = next(iterator)
            total += strategy.experimental_local_results(xb)[0][0, 0]
        return total

    parts = {"compute": compute, "exchange": exchange, "input": read_input}
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


def run_mwms(spec: dict[str, Any]) -> dict[str, Any]:
    """Times every side and the step parts on this worker; returns seconds, steps and updates per measurement."""
    strategy = tfdist.make_strategy("multi_worker")
    workers = strategy.num_replicas_in_sync
    b = int(spec["per_worker_batch_size"])
    global_batch_size = b * workers
    steps, repeats = int(spec["steps"]), int(spec["repeats"])
    dataset = make_dataset(spec, global_batch_size)
    keras.utils.set_random_seed(0)
    weights = build_model(spec).get_weights()
    builder = fits.with_weights(lambda: build_model(spec), weights)
    sgd = lambda: keras.optimizers.SGD(spec["learning_rate"])  # noqa: E731
    metrics = list(spec["metrics"])
    sides: dict[str, Side] = {}
    unavailable: dict[str, str] = {}
    for variant in spec["gradient_compression"]:
        name = "trainer" if variant in (None, "none") else f"trainer_{variant}"
        kwargs = trainer_kwargs(variant, spec.get("bucket_bytes"))
        if kwargs is None:
            unavailable[name] = (
                "this tfdist.Trainer does not take gradient_compression/bucket_bytes"
            )
            continue
        try:
            trainer = tfdist.Trainer(
                builder,
                strategy=strategy,
                optimizer=sgd(),
                loss=fits.logits_loss(),
                metrics=metrics,
                **kwargs,
            )
        except (TypeError, ValueError) as e:  # e.g. a variant this Trainer refuses on this machine
            unavailable[name] = f"{type(e).__name__}: {e}"
            continue
        fit = (lambda t: lambda **kw: t.fit(dataset, global_batch_size=global_batch_size, **kw))(
            trainer
        )
        sides[name] = _fit_side(
            fit, (lambda t: lambda: t.model.optimizer)(trainer), steps, global_batch_size
        )
    with strategy.scope():
        model = builder()
        model.compile(optimizer=sgd(), loss=fits.logits_loss(), metrics=metrics)
    sides["keras_fit"] = _fit_side(
        lambda **kw: model.fit(dataset, shuffle=False, **kw),
        lambda: model.optimizer,
        steps,
        global_batch_size,
    )
    for variant in spec["gradient_compression"]:
        name = "raw_loop" if variant in (None, "none") else f"raw_loop_{variant}"
        sides[name] = raw_loop_side(
            strategy,
            spec,
            weights,
            dataset,
            global_batch_size,
            None if variant == "none" else variant,
        )
    recorder = Recorder()
    for side in sides.values():
        side.run(steps)  # untimed: traces, fills the dataset cache
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    updates: dict[str, list[int]] = {name: [] for name in sides}
    for r in range(repeats):
        for name in list(sides) if r % 2 == 0 else list(sides)[::-1]:
            before = sides[name].updates()
            took, _ = recorder.measure(name, lambda s=sides[name]: s.run(steps))
            seconds[name].append(took)
            updates[name].append(sides[name].updates() - before)
    parts = {}
    for variant in spec["gradient_compression"]:
        key = "none" if variant in (None, "none") else variant
        parts[key] = split_parts(
            strategy,
            spec,
            weights,
            dataset,
            b,
            None if key == "none" else key,
            recorder,
            steps,
            repeats,
        )
    return {
        "num_workers": workers,
        "global_batch_size": global_batch_size,
        "steps": steps,
        "seconds": seconds,
        "updates": updates,
        "parts_s_per_step": parts,
        "unavailable": unavailable,
        "gradient_bytes": int(sum(w.size for w in weights) * 4),
        "records": recorder.records,
    }


def run_ps(spec: dict[str, Any]) -> dict[str, Any] | None:
    """Parameter-server side: the chief times the Trainer; workers and ps serve (this call never returns there)."""
    strategy = tfdist.make_strategy("parameter_server")  # workers and ps serve here until stopped
    workers = int(spec["ps_workers"])
    b = int(spec["per_worker_batch_size"])
    global_batch_size = b * workers
    steps, repeats = int(spec["steps"]), int(spec["repeats"])
    dataset = make_dataset(spec, global_batch_size)
    keras.utils.set_random_seed(0)
    builder = fits.with_weights(lambda: build_model(spec), build_model(spec).get_weights())
    trainer = tfdist.Trainer(
        builder,
        strategy=strategy,
        optimizer=keras.optimizers.SGD(spec["learning_rate"]),
        loss=fits.logits_loss(),
        metrics=list(spec["metrics"]),
    )
    side = _fit_side(
        lambda **kw: trainer.fit(dataset, global_batch_size=global_batch_size, **kw),
        lambda: trainer.model.optimizer,
        steps,
        global_batch_size,
    )
    recorder = Recorder()
    side.run(steps)
    seconds, updates = [], []
    for _ in range(repeats):
        before = side.updates()
        took, _ = recorder.measure("trainer_ps", lambda: side.run(steps))
        seconds.append(took)
        updates.append(side.updates() - before)
    return {
        "num_workers": workers,
        "global_batch_size": global_batch_size,
        "steps": steps,
        "seconds": {"trainer_ps": seconds},
        "updates": {"trainer_ps": updates},
        "records": recorder.records,
    }
