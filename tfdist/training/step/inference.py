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
from tfdist.training.step.masked_losses import (
    MaskedUpdate,
    global_size,
    log_masked_evaluation,
    replica_loss,
    split,
    track_output_losses,
)
from tfdist.training.step.update import batch_size_of, forward


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
    run = forward_fn or (lambda x, training: forward(model, x, training=training))
    masked = MaskedUpdate()  # the loss's masked terms, known once the cond's branch is traced

    def step(batches: Sequence[Any]) -> None:
        for data in batches:
            x, y, sample_weight = unpack_x_y_sample_weight(data)
            size = batch_size_of(x)
            # Outside the cond: every replica takes part in the all-reduce, empty or not.
            total = global_size(model, size)

            def update_metrics(x=x, y=y, sample_weight=sample_weight, size=size, total=total):
                # The tape only gives the masked terms' coefficients in the loss (losses.split).
                with tf.GradientTape(persistent=True) as tape:
                    y_pred = run(x, training=False)
                    replica = replica_loss(model, (x, y, y_pred, sample_weight), training=False)
                    replicas = tf.distribute.get_replica_context().num_replicas_in_sync
                    parts = split(tape, replica, replicas) if replica.terms else None
                model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
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

            # Workers top up their shard with empty batches so that all run the
            # same number of steps. Some kernels (oneDNN convolutions) reject
            # empty inputs, so skip them; inference updates no synchronised
            # variables, so a cond is safe here (it is not in training, where
            # e.g. a summed counter would need a merge_call).
            packed = tf.cond(
                size > 0, update_metrics, lambda: tf.zeros([masked.length + len(masked.recorded)])
            )
            if masked.terms:
                log_masked_evaluation(model, masked, packed, size)

    return step


def make_predict_step(
    model: keras.Model, *, custom: bool = False, forward_fn: Callable[..., Any] | None = None
) -> Callable[[Any], Any]:
    """Returns ``step(batch)``: the model's outputs on one batch's inputs, in replica context.

    ``y`` and sample weights in the batch are ignored. An empty batch (a
    replica's share of a partial last batch) gives outputs with zero rows,
    without running the model on it (some kernels reject empty inputs). With
    ``custom``, the model's own ``predict_step(data)`` gives the outputs;
    ``forward_fn(x, training)``: another forward pass (a pipeline's stages).
    """
    run = forward_fn or (lambda x, training: forward(model, x, training=training))

    def outputs(data: Any) -> Any:
        if custom:
            return model.predict_step(data)
        return run(unpack_x_y_sample_weight(data)[0], training=False)

    def step(data: Any) -> Any:
        x, _, _ = unpack_x_y_sample_weight(data)

        def one_example():
            # Only the output structure, dtypes and trailing shapes are used.
            zeros = tf.nest.map_structure(
                lambda t: tf.zeros(tf.concat([[1], tf.shape(t)[1:]], axis=0), t.dtype), data
            )
            return tf.nest.map_structure(lambda t: t[:0], outputs(zeros))

        return tf.cond(batch_size_of(x) > 0, lambda: outputs(data), one_example)

    return step
