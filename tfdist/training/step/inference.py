"""The replica steps of evaluation and prediction, shared by every runner.

Evaluation counts each example once, as ``model.evaluate``; prediction gives each
batch's outputs. Training's replica step is `tfdist.training.step.update`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import keras
import tensorflow as tf
from keras.utils import unpack_x_y_sample_weight

from tfdist._compat.keras_internals.keras_training import loss_tracker, unscale_loss
from tfdist._compat.keras_internals.masks import keras_mask, with_keras_mask
from tfdist.training.step.masked_losses import (
    MaskedUpdate,
    global_size,
    log_masked_evaluation,
    replica_loss,
    split,
    track_output_losses,
)
from tfdist.training.step.update import batch_size_of, forward, forward_never_empty


def make_eval_step(
    model: keras.Model, *, forward_fn: Callable[..., Any] | None = None
) -> Callable[[Sequence[Any]], None]:
    """Returns ``step(batches)``: updates the loss tracker and metrics, in replica context.

    Each example counts once, exactly as in ``model.evaluate``; empty batches
    (padding that keeps every worker on the same step count) count for nothing.
    A masked loss term is weighed by the batch's global valid count
    (`tfdist.training.step.masked_losses`): its sums leave the cond, and the ``loss``
    logs are updated after one all-reduce of the counts, in which every replica
    takes part. ``forward_fn(x, training)``: another forward pass (a pipeline's stages).
    """
    masked = MaskedUpdate()  # the loss's masked terms, known once the cond's branch is traced

    def step(batches: Sequence[Any]) -> None:
        for data in batches:
            x, y, sample_weight = unpack_x_y_sample_weight(data)
            size = batch_size_of(x)
            # Outside the cond: every replica takes part in the all-reduce, empty or not.
            total = global_size(model, size)
            # The forward too, as Keras's evaluate runs it on every replica: a layer's merge_call
            # (a "sum" counter's assign_add) is refused in a cond's branch. An empty batch runs
            # one all-zero example (some kernels reject empty inputs), its outputs cut away.
            y_pred = forward_never_empty(model, x, size, training=False, run=forward_fn)

            def update_metrics(
                x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, size=size, total=total
            ):
                # The tape only gives the masked terms' coefficients in the loss (losses.split).
                with tf.GradientTape(persistent=True) as tape:
                    y_pred_here = tf.nest.map_structure(lambda t: _watched(tape, t), y_pred)
                    batch = (x, y, y_pred_here, sample_weight)
                    replica = replica_loss(model, batch, training=False)
                    replicas = tf.distribute.get_replica_context().num_replicas_in_sync
                    parts = split(tape, replica, replicas) if replica.terms else None
                model.compute_metrics(x, y, y_pred_here, sample_weight=sample_weight)
                masked.learn(replica, [])
                if parts is None:
                    loss_tracker(model).update_state(unscale_loss(replica.loss), sample_weight=size)
                    track_output_losses(replica.recorded, size, total)
                    return tf.zeros([0])
                rest_log = unscale_loss(parts.rest) * tf.cast(size, parts.rest.dtype)
                means = [tf.cast(mean, tf.float32) for _, mean in replica.recorded]
                return tf.concat(
                    [masked.pack(parts, rest_log, []), *[tf.reshape(m, [1]) for m in means]], 0
                )

            # Workers top up their shard with empty batches so that all run the same number
            # of steps: their loss and metrics must not count (a mean over no example is NaN).
            # The branch updates only metrics (no merge_call), so a cond is safe here.
            packed = tf.cond(
                size > 0, update_metrics, lambda: tf.zeros([masked.length + len(masked.recorded)])
            )
            if masked.terms:
                log_masked_evaluation(model, masked, packed, size)

    return step


def _watched(tape: tf.GradientTape, t: Any) -> Any:
    """``t`` inside the cond's branch, watched by ``tape`` (it was computed outside it), its
    Keras mask kept: the masked terms' coefficients are gradients from the loss to them."""
    if t is None or not t.dtype.is_floating:
        return t
    here = tf.identity(t)
    tape.watch(here)
    return with_keras_mask(here, keras_mask(t))


def make_predict_step(
    model: keras.Model, *, custom: bool = False, forward_fn: Callable[..., Any] | None = None
) -> Callable[[Any], Any]:
    """Returns ``step(batch)``: the model's outputs on one batch's inputs, in replica context.

    ``y`` and sample weights in the batch are ignored. An empty batch (a
    replica's share of a partial last batch) gives outputs with zero rows: the model runs on
    one all-zero example instead (some kernels reject empty inputs), its outputs cut away, and
    outside any cond (a layer's merge_call, a "sum" counter's, is refused in a cond's branch;
    Keras's predict runs the model on every replica). With ``custom``, the model's own
    ``predict_step(data)`` gives the outputs; ``forward_fn(x, training)``: another forward
    pass (a pipeline's stages).
    """
    run = forward_fn or (lambda x, training: forward(model, x, training=training))

    def outputs(data: Any) -> Any:
        if custom:
            return model.predict_step(data)
        return run(unpack_x_y_sample_weight(data)[0], training=False)

    def step(data: Any) -> Any:
        x, _, _ = unpack_x_y_sample_weight(data)
        size = tf.cast(batch_size_of(x), tf.int32)

        def one_zero_example(t: Any) -> Any:
            return tf.zeros(tf.concat([[1], tf.shape(t)[1:]], axis=0), t.dtype)

        # A cond only picks the input (no side effects in it), as the train step's does.
        fed = tf.cond(size > 0, lambda: data, lambda: tf.nest.map_structure(one_zero_example, data))
        return tf.nest.map_structure(lambda t: t[:size], outputs(fed))

    return step
