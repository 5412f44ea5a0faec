"""Gradient helpers of the replica step: ``ShardedVariable``-aware gradients, and scaling.

Kept apart from `tfdist.training.step.update`, which decides *what* an update
does; these only turn a tape into one gradient per Keras variable and
add or multiply gradients, dense or ``tf.IndexedSlices``.

A sparse gradient (an ``Embedding`` lookup's ``tf.IndexedSlices``) stays sparse up to the
optimizer, as Keras's ``fit`` hands it: Keras's optimizers treat duplicate rows nonlinearly
(Adam squares each row before duplicates are summed), so a gradient densified early (duplicate
rows summed) gives other weights. Micro-batches' slices are concatenated, not summed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tfdist._compat.tf_internals.partitioned import shards_of


def partitioned_gradients(
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
            grads.append(None if any(p is None for p in parts) else _joined(parts, sources[i:]))
            i += span
    return grads


class SparseGradientsFound(Exception):
    """The first trace of an accumulation loop's body found ``tf.IndexedSlices`` gradients."""


def add_gradients(a: Any, b: Any) -> Any:
    """``a + b`` for gradients of one variable: dense sums, ``tf.IndexedSlices`` rows concatenated
    (duplicates kept, as one device's larger batch holds them); a dense ``a`` takes ``b`` dense."""
    if isinstance(a, tf.IndexedSlices) and isinstance(b, tf.IndexedSlices):
        return tf.IndexedSlices(
            tf.concat([a.values, b.values], 0),
            tf.concat([a.indices, tf.cast(b.indices, a.indices.dtype)], 0),
            a.dense_shape,
        )
    if isinstance(a, tf.IndexedSlices) or isinstance(b, tf.IndexedSlices):
        return tf.convert_to_tensor(a) + tf.convert_to_tensor(b)
    return a + b


def dense_part(g: Any) -> tf.Tensor:
    """The values of a ``tf.IndexedSlices`` (for checks that look at every element), else ``g``."""
    return g.values if isinstance(g, tf.IndexedSlices) else g


def _joined(parts: Sequence[Any], shards: Sequence[Any]) -> Any:
    """The shards' gradients as one gradient of the whole variable (split on axis 0): sparse
    when every part is, its indices moved by each shard's first row."""
    if not all(isinstance(p, tf.IndexedSlices) for p in parts):
        return tf.concat([tf.convert_to_tensor(p) for p in parts], axis=0)
    offsets, first = [], 0
    for shard in shards[: len(parts)]:
        offsets.append(first)
        first += shard.shape[0]
    whole = tf.concat([[first], tf.shape(parts[0].values)[1:]], 0)
    return tf.IndexedSlices(
        tf.concat([p.values for p in parts], 0),
        tf.concat([p.indices + tf.cast(o, p.indices.dtype) for p, o in zip(parts, offsets)], 0),
        tf.cast(whole, tf.int64),
    )


def scale_gradient(g: Any, factor: tf.Tensor) -> Any:
    """``g * factor`` in ``g``'s dtype, dense or ``tf.IndexedSlices`` (None stays None)."""
    if g is None:
        return None
    if isinstance(g, tf.IndexedSlices):
        return tf.IndexedSlices(
            g.values * tf.cast(factor, g.values.dtype), g.indices, g.dense_shape
        )
    return g * tf.cast(factor, g.dtype)
