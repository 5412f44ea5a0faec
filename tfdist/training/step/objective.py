"""A micro-batch's loss as every update differentiates and logs it, written once.

`objective` is Keras's loss of one replica's micro-batch, normalised by the **global** batch of
the update (``global_batch_size * k``) and loss-scaled (fp16), with its masked terms taken
apart (`tfdist.training.step.masked_losses`); `record` updates the loss tracker and the
compiled metrics. The plain step (`tfdist.training.step.update`) calls both on the whole
micro-batch, the pipeline (`tfdist.training.pipeline.schedule`) on each of its pieces, on the
last stage.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import keras
import tensorflow as tf

from tfdist._compat.keras_internals.keras_training import loss_tracker, unscale_loss
from tfdist.training.step.masked_losses import ReplicaLoss, Split, replica_loss, split


@dataclasses.dataclass(frozen=True)
class Objective:
    """One micro-batch's loss, ready to differentiate and to log.

    Attributes:
        replica: Keras's loss of the replica's micro-batch.
        parts: Its masked terms taken apart, or None (no masked terms).
        targets: What is differentiated, loss-scaled: the normalised loss (without the masked
            terms), then each masked term's weighted local sum ``c_j * S_j``.
        rest_log: The loss without the masked terms, summed over the micro-batch (unscaled).
    """

    replica: ReplicaLoss
    parts: Split | None
    targets: list[tf.Tensor]
    rest_log: tf.Tensor


def objective(
    tape: tf.GradientTape,
    model: keras.Model,
    optimizer: keras.optimizers.Optimizer,
    data: tuple[Any, Any, Any, Any],
    size: tf.Tensor,
    *,
    num_replicas: int,
    expected: float,
) -> Objective:
    """The `Objective` of ``data`` (``(x, y, y_pred, sample_weight)``) of ``size`` examples,
    under ``tape``; ``expected``: the update's examples over all replicas (``gbs * k``)."""
    replica = replica_loss(model, data, training=True)
    parts = split(tape, replica, num_replicas) if replica.terms else None
    rest = replica.loss if parts is None else parts.rest
    # Keras's loss is the local mean (+ regularisers) / num_replicas (its mean a divide_no_nan:
    # an empty replica batch gives zero) ->
    # (sum of local losses + size * regularisers) / (global batch * k).
    scale = tf.cast(size * num_replicas / expected, rest.dtype)
    targets = [optimizer.scale_loss(rest * scale)]
    if parts is not None:
        targets += [optimizer.scale_loss(c * s) for c, s in parts.weighted()]
    rest_log = unscale_loss(rest) * tf.cast(size, rest.dtype)
    return Objective(replica, parts, targets, rest_log)


def record(
    model: keras.Model, loss: Objective, data: tuple[Any, Any, Any, Any], size: tf.Tensor
) -> None:
    """The loss tracker and the compiled metrics of ``data`` (``(x, y, y_pred,
    sample_weight)``). With masked terms the update logs the loss, over its valid count."""
    x, y, y_pred, sample_weight = data
    if loss.parts is None:
        loss_tracker(model).update_state(unscale_loss(loss.replica.loss), sample_weight=size)
    model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
