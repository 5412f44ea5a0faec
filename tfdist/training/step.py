"""The replica step, written once and shared by every runner.

A training *update* runs in replica context on ``k`` micro-batches:

1. forward pass and Keras's compiled loss on each micro-batch;
2. the loss is normalised by the **global** batch (``global_batch_size * k``)
   and multiplied by the loss scale (fp16);
3. gradients are summed locally over the ``k`` micro-batches (in a
   ``tf.while_loop`` when the runner drives ``TrainUpdate.cross_replica``, so the
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


class TrainUpdate:
    """One optimizer update on ``k`` micro-batches, in replica context (see the module docstring).

    Call it as ``update(micro_batches)`` in replica context (the micro-batches
    unrolled), or drive it from cross-replica context with
    :meth:`cross_replica`, which keeps the ``k`` micro-batches in a
    ``tf.while_loop`` (gradient sums as loop variables), so the graph holds one
    forward and backward pass whatever ``k``. Runners that can call ``next``
    between replica calls use :meth:`cross_replica`.

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

    def __init__(
        self,
        model: keras.Model,
        optimizer: keras.optimizers.Optimizer,
        *,
        global_batch_size: int,
        accumulation_steps: int,
        num_replicas: int,
        skipped_updates: tf.Variable | None = None,
        bucket_bytes: int | None = None,
        gradient_compression: str | None = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.accumulation_steps = accumulation_steps
        self.num_replicas = num_replicas
        self.skipped_updates = skipped_updates
        self.bucket_bytes = bucket_bytes
        self.gradient_compression = gradient_compression
        self.expected = float(global_batch_size * accumulation_steps)
        self.present: list[int] = []  # indices of variables with a gradient (known once traced)
        self.tracked: list[int] = []  # ids of the per-output loss trackers Keras updates

    def micro_step(self, data: Any) -> tuple[list[Any], tf.Tensor, list[tf.Tensor]]:
        """Forward, loss, metrics and local gradients of one micro-batch (replica context).

        Returns the gradients, the batch's example count and its per-output loss sums.
        """
        model = self.model
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
            objective = loss * tf.cast(size * self.num_replicas / self.expected, loss.dtype)
            objective = self.optimizer.scale_loss(objective)
        grads = sharded_gradients(tape, objective, model.trainable_variables)
        model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
        if not self.present:
            self.present.extend(i for i, g in enumerate(grads) if g is not None)
            self.tracked.extend(id(tracker) for tracker, _ in recorded)
        # Per-output loss sums over this replica's examples, logged once per update (apply);
        # one per tracker (zero for one Keras did not update: a compute_loss override).
        means = {id(tracker): mean for tracker, mean in recorded}
        sums = [
            tf.cast(means.get(id(t), 0.0), tf.float32) * size for t in output_loss_trackers(model)
        ]
        return grads, size, sums

    def apply(self, summed: Sequence[Any], count: tf.Tensor, output_sums: Sequence[Any]) -> None:
        """One exchange and one optimizer update; ``summed`` holds the present variables' sums.

        ``output_sums``: this replica's per-output loss sums over its ``count`` examples.
        """
        variables = self.model.trainable_variables
        reduced, total = all_reduce_sum(
            summed,
            count,
            num_replicas=self.num_replicas,
            bucket_bytes=self.bucket_bytes,
            compression=self.gradient_compression,
        )
        # An update is one batch of Keras's with a k-times batch: its per-output means count once.
        means = [
            (tracker, tf.math.divide_no_nan(s, count))
            for tracker, s in zip(output_loss_trackers(self.model), output_sums)
            if id(tracker) in self.tracked
        ]
        _track_output_losses(means, count, total)
        factor = tf.math.divide_no_nan(tf.constant(self.expected), total)
        grads: list[Any] = [None] * len(variables)
        for i, g in zip(self.present, reduced):
            grads[i] = scale_gradient(g, factor)
        if self.skipped_updates is not None:
            finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in reduced])
            self.skipped_updates.assign_add(tf.cast(tf.logical_not(finite), tf.int64))
        self.optimizer.apply(grads, variables)

    def __call__(self, micro_batches: Sequence[Any]) -> None:
        """One update on ``micro_batches`` (the loop unrolled), in replica context."""
        summed: list[Any] | None = None
        count = tf.constant(0.0)
        output_sums: list[Any] = []
        for data in micro_batches:
            grads, size, losses = self.micro_step(data)
            if summed is None:
                summed = [tf.convert_to_tensor(grads[i]) for i in self.present]
                output_sums = losses
            else:
                summed = [a + tf.convert_to_tensor(grads[i]) for a, i in zip(summed, self.present)]
                output_sums = [a + b for a, b in zip(output_sums, losses)]
            count += size
        self.apply(summed, count, output_sums)

    def zeros(self) -> State:
        """The accumulation loop's starting state (replica context)."""
        # Every trainable variable gets a sum; those without a gradient stay zero, not applied.
        # The model is built before the step is traced, so its per-output trackers exist.
        return (
            [tf.zeros(v.shape, v.dtype) for v in self.model.trainable_variables],
            tf.constant(0.0),
            [tf.constant(0.0) for _ in output_loss_trackers(self.model)],
        )

    def accumulate(self, data: Any, state: State) -> State:
        """``state`` plus one micro-batch's gradients, examples and loss sums."""
        sums, count, output_sums = state
        grads, size, losses = self.micro_step(data)
        return (
            [s if g is None else s + tf.convert_to_tensor(g) for s, g in zip(sums, grads)],
            count + size,
            [a + b for a, b in zip(output_sums, losses)],
        )

    def finish(self, state: State) -> None:
        """The update from the accumulated ``state``."""
        # Loop outputs carry no device; MWMS places an all-reduce by its inputs' devices, so
        # re-create them here, under the replica's device scope.
        sums, count, output_sums = tf.nest.map_structure(tf.identity, state)
        self.apply([sums[i] for i in self.present], count, output_sums)

    def cross_replica(self, run: Callable[..., Any], next_batch: Callable[[], Any]) -> None:
        """One update from cross-replica context; the micro-batch loop stays symbolic.

        ``run(fn, args)`` runs ``fn`` on every replica (``strategy.run``) and
        ``next_batch()`` gets the next distributed batch.
        """
        if self.accumulation_steps == 1:
            # No loop: the gradients flow straight into the (bucketed) exchange.
            run(self.__call__, ([next_batch()],))
            return

        def body(i, state):
            return i + 1, run(self.accumulate, (next_batch(), state))

        # Starting from zeros, the sums are bit for bit those of the unrolled loop (0 + g == g).
        _, state = tf.while_loop(
            lambda i, _: i < self.accumulation_steps,
            body,
            (tf.constant(0), run(self.zeros, ())),
            parallel_iterations=1,
        )
        run(self.finish, (state,))


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
