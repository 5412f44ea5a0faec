"""Gradient helpers of the replica step: ``ShardedVariable``-aware gradients, and scaling.

Kept apart from `tfdist.training.step`, which decides *what* an update
does; these only turn a tape into one gradient per Keras variable and
multiply gradients (dense or ``tf.IndexedSlices``) by a factor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tfdist._compat.sharded import shards_of


def sharded_gradients(
    tape: tf.GradientTape, target: tf.Tensor, variables: Sequence[Any]
) -> list[Any]:
    """``tape.gradient`` that also handles ``ShardedVariable`` (one gradient per Keras variable).

    Keras variables that wrap a ShardedVariable cannot be gradient sources
    themselves; take the gradient of each shard and concatenate along axis 0.
    """
    spans, sources = [], []
    for v in variables:
        shards = shards_of(v)  # a Keras variable partitioned across ps tasks
        spans.append(None if shards is None else len(shards))
        sources.extend(shards if shards is not None else [v])
    flat = tape.gradient(target, sources)
    grads, i = [], 0
    for span in spans:
        if span is None:
            grads.append(flat[i])
            i += 1
        else:
            parts = flat[i : i + span]
            grads.append(
                None
                if any(p is None for p in parts)
                else tf.concat([tf.convert_to_tensor(p) for p in parts], axis=0)
            )
            i += span
    return grads


def scale_gradient(g: Any, factor: tf.Tensor) -> Any:
    """``g * factor`` in ``g``'s dtype, dense or ``tf.IndexedSlices`` (None stays None)."""
    if g is None:
        return None
    if isinstance(g, tf.IndexedSlices):
        return tf.IndexedSlices(
            g.values * tf.cast(factor, g.values.dtype), g.indices, g.dense_shape
        )
    return g * tf.cast(factor, g.dtype)
