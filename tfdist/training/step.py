"""The replica step, written once and shared by every runner.

A training *update* runs in replica context on ``k`` micro-batches:

1. forward pass and Keras's compiled loss on each micro-batch;
2. the loss is normalised by the **global** batch (``global_batch_size * k``)
   and multiplied by the loss scale (fp16);
3. gradients are summed locally over the ``k`` micro-batches (in a
   ``tf.while_loop`` when the runner drives ``update.cross_replica``, so the
   graph does not grow with ``k``);
4. **one** exchange of the gradients, packed with the example count
   (optionally bucketed and 16-bit, see :mod:`tfdist.training.exchange`);
5. the gradients are corrected by ``expected / actual`` examples (exactly 1.0
   for full batches, so partial batches are still a true mean);
6. one ``optimizer.apply`` (the loss-scale optimizer unscales and skips
   non-finite updates).

With ``Trainer(accumulation_steps=k)`` the effective batch is
``k * global_batch_size``. ``steps_per_epoch`` still counts micro-batches;
when it is not a multiple of ``k``, the epoch's last few micro-batches make
one smaller update, still normalised by its own examples.
``optimizer.iterations``, learning-rate schedules and the logs' ``updates``
count updates. An optimizer's Keras ``gradient_accumulation_steps`` (which
fails under tf.distribute) is taken over as ``accumulation_steps``.

The gradient helpers (``ShardedVariable``-aware gradients, scaling) are in
:mod:`tfdist.training.gradients`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import keras
import tensorflow as tf
from keras.utils import unpack_x_y_sample_weight

from tfdist._compat.keras_training import (
    loss_tracker,
    output_loss_trackers,
    recorded_updates,
    unscale_loss,
)
from tfdist.training.exchange import all_reduce_sum
from tfdist.training.gradients import scale_gradient, sharded_gradients


def _batch_size(x: Any) -> tf.Tensor:
    first = next(t for t in tf.nest.flatten(x) if t is not None)
    return tf.cast(tf.shape(first)[0], tf.float32)


def _forward_never_empty(model: keras.Model, x: Any, size: tf.Tensor) -> Any:
    """Training forward pass that never feeds an empty batch to the model.

    A partial global batch smaller than the replica count leaves some replicas
    an empty batch, which some kernels (oneDNN convolutions) reject. A cond
    that skips the step, as evaluation does, is not safe in training (layers
    such as BatchNormalization update mirrored variables with a merge_call).
    So an empty batch gets one all-zero example, and the predictions are cut
    back to the real examples: the loss, gradients and metrics see only those.
    (The dummy does enter that replica's BatchNormalization batch statistics.)
    """
    n = tf.cast(size, tf.int32)

    def one_zero_example(t):
        return None if t is None else tf.zeros(tf.concat([[1], tf.shape(t)[1:]], 0), t.dtype)

    # A cond only picks the input (no side effects in it), so full batches are not copied.
    inputs = tf.cond(n > 0, lambda: x, lambda: tf.nest.map_structure(one_zero_example, x))
    y_pred = _forward(model, inputs, training=True)
    return tf.nest.map_structure(lambda t: t[:n], y_pred)  # an identity slice for full batches


def _takes_training(method: Callable[..., Any]) -> bool:
    # A user's call()/compute_loss() override may lack `training` (compute_loss got it in
    # Keras 3.3); Keras probes the signature the same way. Read at trace time only.
    return "training" in inspect.signature(method).parameters


def _forward(model: keras.Model, x: Any, training: bool) -> Any:
    if _takes_training(model.call):
        return model(x, training=training)
    return model(x)


def _loss(
    model: keras.Model, x: Any, y: Any, y_pred: Any, sample_weight: Any, training: bool
) -> tf.Tensor:
    """Keras's compiled loss (+ regularisers) of one replica's batch, over the replica count."""
    if _takes_training(model.compute_loss):
        return model.compute_loss(
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training
        )
    return model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight)


def _global_size(model: keras.Model, size: tf.Tensor) -> tf.Tensor:
    """This batch's examples on all replicas when the per-output loss logs need it, else ``size``.

    Runs in replica context (in cross-replica context one call sees the whole batch). Only
    evaluation of a model with several compiled losses on several replicas needs it: one
    scalar all-reduce per batch (training reads the count its gradient exchange carries).
    """
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1 or not output_loss_trackers(model):
        return size
    return context.all_reduce(tf.distribute.ReduceOp.SUM, size)


def _tracked_loss(
    model: keras.Model, data: tuple[Any, Any, Any, Any], *, size: tf.Tensor, training: bool
) -> tuple[tf.Tensor, list[tuple[keras.metrics.Metric, tf.Tensor]]]:
    """``_loss`` of ``data = (x, y, y_pred, sample_weight)``; updates the ``loss`` log.

    The ``loss`` log is a mean over examples: each replica's (unscaled) mean weighs its
    batch. The per-output losses Keras would log are returned instead, each with its
    tracker, for :func:`_track_output_losses`.
    """
    x, y, y_pred, sample_weight = data
    with recorded_updates(output_loss_trackers(model)) as recorded:
        loss = _loss(model, x, y, y_pred, sample_weight, training=training)
    loss_tracker(model).update_state(unscale_loss(loss), sample_weight=size)
    return loss, recorded


def _track_output_losses(
    recorded: list[tuple[keras.metrics.Metric, tf.Tensor]], examples: tf.Tensor, total: tf.Tensor
) -> None:
    """Counts each ``<output>_loss`` mean once per global batch (or update), as Keras does.

    Keras weighs a batch's per-output loss by the batch's static size, unknown for a
    partial batch, so each batch counts once whatever its size. Each replica weighs its
    mean over its ``examples`` by its share of the ``total`` examples on all replicas:
    the sums over the replicas hold the global mean, counted once. Exact for partial
    and empty replica batches.
    """
    share = tf.math.divide_no_nan(examples, total)
    for tracker, mean in recorded:
        tracker.update_state(mean, sample_weight=share)


#: The accumulation loop's state: gradient sums, examples, per-output loss sums.
State = tuple[list[tf.Tensor], tf.Tensor, list[tf.Tensor]]


def make_train_update(
    model: keras.Model,
    optimizer: keras.optimizers.Optimizer,
    *,
    global_batch_size: int,
    accumulation_steps: int,
    num_replicas: int,
    skipped_updates: tf.Variable | None = None,
    bucket_bytes: int | None = None,
    gradient_compression: str | None = None,
) -> Callable[[Sequence[Any]], None]:
    """Returns ``update(micro_batches)``: one optimizer update in replica context.

    The returned function also has ``update.cross_replica(run, next_batch)``,
    the same update driven from cross-replica context with the ``k``
    micro-batches in a ``tf.while_loop`` (gradient sums as loop variables), so
    the graph holds one forward and backward pass whatever ``k``. ``run(fn,
    args)`` runs ``fn`` on every replica (``strategy.run``) and
    ``next_batch()`` gets the next distributed batch. Runners that can call
    ``next`` between replica calls use it; others call ``update`` with the
    list of ``k`` batches, which unrolls the micro-batches.

    Args:
        model: A compiled Keras model (its loss, metrics and loss tracker are used).
        optimizer: The model's optimizer, possibly a ``LossScaleOptimizer``.
            It must not all-reduce again: wrap calls in
            ``tfdist._compat.gradients_already_summed``.
        global_batch_size: Examples per micro-batch across all replicas.
        accumulation_steps: ``k``, micro-batches per update.
        num_replicas: ``num_replicas_in_sync``.
        skipped_updates: With loss scaling, a counter of updates skipped for
            non-finite gradients (the same decision on every replica, since it
            is taken after the all-reduce).
        bucket_bytes: Bucketed all-reduce (see :mod:`tfdist.training.exchange`).
        gradient_compression: ``"bf16"``, ``"fp16"`` or ``None``.
    """
    expected = float(global_batch_size * accumulation_steps)
    present: list[int] = []  # indices of variables that get a gradient (known once traced)
    tracked: list[int] = []  # ids of the per-output loss trackers Keras updates (once traced)

    def micro_step(data: Any) -> tuple[list[Any], tf.Tensor]:
        """Forward, loss, metrics and local gradients of one micro-batch (replica context)."""
        x, y, sample_weight = unpack_x_y_sample_weight(data)
        size = _batch_size(x)
        with tf.GradientTape() as tape:
            y_pred = _forward_never_empty(model, x, size)
            # Keras's loss: local mean (+ regularisers) / num_replicas. Its
            # mean is a divide_no_nan, so an empty replica batch (the tail
            # of a partial global batch) gives zero loss and gradients.
            loss, recorded = _tracked_loss(
                model, (x, y, y_pred, sample_weight), size=size, training=True
            )
            # -> (sum of local losses + size * regularisers) / (global batch * k)
            objective = loss * tf.cast(size * num_replicas / expected, loss.dtype)
            objective = optimizer.scale_loss(objective)
        grads = sharded_gradients(tape, objective, model.trainable_variables)
        model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
        if not present:
            present.extend(i for i, g in enumerate(grads) if g is not None)
            tracked.extend(id(tracker) for tracker, _ in recorded)
        # Per-output loss sums over this replica's examples, logged once per update (apply);
        # one per tracker (zero for one Keras did not update: a compute_loss override).
        means = {id(tracker): mean for tracker, mean in recorded}
        return (
            grads,
            size,
            [
                tf.cast(means.get(id(t), 0.0), tf.float32) * size
                for t in output_loss_trackers(model)
            ],
        )

    def apply(summed: Sequence[Any], count: tf.Tensor, output_sums: Sequence[Any]) -> None:
        """One exchange and one optimizer update; ``summed`` holds the present variables' sums.

        ``output_sums``: this replica's per-output loss sums over its ``count`` examples.
        """
        variables = model.trainable_variables
        reduced, total = all_reduce_sum(
            summed,
            count,
            num_replicas=num_replicas,
            bucket_bytes=bucket_bytes,
            compression=gradient_compression,
        )
        # An update is one batch of Keras's with a k-times batch: its per-output means count once.
        means = [
            (tracker, tf.math.divide_no_nan(s, count))
            for tracker, s in zip(output_loss_trackers(model), output_sums)
            if id(tracker) in tracked
        ]
        _track_output_losses(means, count, total)
        factor = tf.math.divide_no_nan(tf.constant(expected), total)
        grads: list[Any] = [None] * len(variables)
        for i, g in zip(present, reduced):
            grads[i] = scale_gradient(g, factor)
        if skipped_updates is not None:
            finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in reduced])
            skipped_updates.assign_add(tf.cast(tf.logical_not(finite), tf.int64))
        optimizer.apply(grads, variables)

    def update(micro_batches: Sequence[Any]) -> None:
        summed: list[Any] | None = None
        count = tf.constant(0.0)
        output_sums: list[Any] = []
        for data in micro_batches:
            grads, size, losses = micro_step(data)
            if summed is None:
                summed = [tf.convert_to_tensor(grads[i]) for i in present]
                output_sums = losses
            else:
                summed = [a + tf.convert_to_tensor(grads[i]) for a, i in zip(summed, present)]
                output_sums = [a + b for a, b in zip(output_sums, losses)]
            count += size
        apply(summed, count, output_sums)

    def zeros() -> State:
        # Every trainable variable gets a sum; those without a gradient stay zero, not applied.
        # The model is built before the step is traced, so its per-output trackers exist.
        return (
            [tf.zeros(v.shape, v.dtype) for v in model.trainable_variables],
            tf.constant(0.0),
            [tf.constant(0.0) for _ in output_loss_trackers(model)],
        )

    def accumulate(data: Any, state: State) -> State:
        sums, count, output_sums = state
        grads, size, losses = micro_step(data)
        return (
            [s if g is None else s + tf.convert_to_tensor(g) for s, g in zip(sums, grads)],
            count + size,
            [a + b for a, b in zip(output_sums, losses)],
        )

    def finish(state: State) -> None:
        # Loop outputs carry no device; MWMS places an all-reduce by its inputs' devices, so
        # re-create them here, under the replica's device scope.
        sums, count, output_sums = tf.nest.map_structure(tf.identity, state)
        apply([sums[i] for i in present], count, output_sums)

    def cross_replica(run: Callable[..., Any], next_batch: Callable[[], Any]) -> None:
        """One update from cross-replica context; the micro-batch loop stays symbolic."""
        if accumulation_steps == 1:
            # No loop: the gradients flow straight into the (bucketed) exchange.
            run(update, ([next_batch()],))
            return

        def body(i, state):
            return i + 1, run(accumulate, (next_batch(), state))

        # Starting from zeros, the sums are bit for bit those of the unrolled loop (0 + g == g).
        _, state = tf.while_loop(
            lambda i, _: i < accumulation_steps,
            body,
            (tf.constant(0), run(zeros, ())),
            parallel_iterations=1,
        )
        run(finish, (state,))

    update.cross_replica = cross_replica
    return update


def make_eval_step(model: keras.Model) -> Callable[[Sequence[Any]], None]:
    """Returns ``step(batches)``: updates the loss tracker and metrics, in replica context.

    Each example counts once, exactly as in ``model.evaluate``; empty batches
    (padding that keeps every worker on the same step count) count for nothing.
    """

    def step(batches: Sequence[Any]) -> None:
        for data in batches:
            x, y, sample_weight = unpack_x_y_sample_weight(data)
            size = _batch_size(x)
            # Outside the cond: every replica takes part in the all-reduce, empty or not.
            total = _global_size(model, size)

            def update_metrics(x=x, y=y, sample_weight=sample_weight, size=size, total=total):
                y_pred = _forward(model, x, training=False)
                _, recorded = _tracked_loss(
                    model, (x, y, y_pred, sample_weight), size=size, training=False
                )
                _track_output_losses(recorded, size, total)
                model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
                return tf.constant(True)

            # Workers top up their shard with empty batches so that all run the
            # same number of steps. Some kernels (oneDNN convolutions) reject
            # empty inputs, so skip them; inference updates no synchronised
            # variables, so a cond is safe here (it is not in training, where
            # e.g. a summed counter would need a merge_call).
            tf.cond(size > 0, update_metrics, lambda: tf.constant(False))

    return step


def make_predict_step(model: keras.Model, *, custom: bool = False) -> Callable[[Any], Any]:
    """Returns ``step(batch)``: the model's outputs on one batch's inputs, in replica context.

    ``y`` and sample weights in the batch are ignored. An empty batch (a
    replica's share of a partial last batch) gives outputs with zero rows,
    without running the model on it (some kernels reject empty inputs). With
    ``custom``, the model's own ``predict_step(data)`` gives the outputs.
    """

    def outputs(data: Any) -> Any:
        if custom:
            return model.predict_step(data)
        return _forward(model, unpack_x_y_sample_weight(data)[0], training=False)

    def step(data: Any) -> Any:
        x, _, _ = unpack_x_y_sample_weight(data)

        def one_example():
            # Only the output structure, dtypes and trailing shapes are used.
            zeros = tf.nest.map_structure(
                lambda t: tf.zeros(tf.concat([[1], tf.shape(t)[1:]], axis=0), t.dtype), data
            )
            return tf.nest.map_structure(lambda t: t[:0], outputs(zeros))

        return tf.cond(_batch_size(x) > 0, lambda: outputs(data), one_example)

    return step
