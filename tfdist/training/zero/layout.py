"""How a variable is cut into one block per replica for sharded optimizer state (ZeRO).

Public TF only. The blocks are gathered into whole tensors for checkpoints and ``.keras``
files by `tfdist.training.zero.checkpoint`.

A variable of ``size`` elements is flattened, padded with zeros to ``N * S`` elements
(``S = max(1, ceil(size / N))``) and cut into ``N`` rows: replica ``r`` holds elements
``r * S`` to ``(r + 1) * S``. The padding stays zero: its gradient is zero, so every built-in
optimizer leaves it at zero (weight decay of zero is zero).
"""

from __future__ import annotations

import math

import tensorflow as tf


def shard_size(size: int, num_replicas: int) -> int:
    """``S``: the elements of each replica's block of a variable of ``size`` elements."""
    return max(1, math.ceil(size / num_replicas))


def blocks(full: tf.Tensor, num_replicas: int) -> tf.Tensor:
    """``full`` flattened, zero-padded and cut into ``[num_replicas, S]`` rows."""
    flat = tf.reshape(full, [-1])
    size = flat.shape.num_elements()
    width = shard_size(size, num_replicas)
    return tf.reshape(tf.pad(flat, [[0, num_replicas * width - size]]), [num_replicas, width])


def block(full: tf.Tensor, num_replicas: int, replica_id: tf.Tensor) -> tf.Tensor:
    """Replica ``replica_id``'s ``[S]`` block of ``full``: a slice of it, zero-padded only
    past its end (no padded copy of the whole tensor)."""
    flat = tf.reshape(full, [-1])
    size = flat.shape.num_elements()
    width = shard_size(size, num_replicas)
    start = tf.minimum(tf.cast(replica_id, tf.int64) * width, size)
    piece = flat[start : start + width]
    if size == num_replicas * width:
        # A copy: a slice may share the whole tensor's buffer, which whatever the block is
        # assigned to (a master shard) would then keep alive in full.
        return tf.ensure_shape(tf.raw_ops.DeepCopy(x=piece), [width])
    return tf.ensure_shape(tf.pad(piece, [[0, width - tf.shape(piece, tf.int64)[0]]]), [width])


def unblock(rows: tf.Tensor, shape: tf.TensorShape) -> tf.Tensor:
    """The ``[N, S]`` (or flat ``[N * S]``) rows back as a tensor of ``shape`` (padding cut)."""
    size = tf.TensorShape(shape).num_elements()
    return tf.reshape(tf.reshape(rows, [-1])[:size], shape)


def block_slices(
    slices: tf.IndexedSlices, shape: tf.TensorShape, num_replicas: int, replica_id: tf.Tensor
) -> tf.IndexedSlices:
    """Replica ``replica_id``'s ``[S]`` block of the tensor of ``shape`` whose rows ``slices``
    hold, as slices of the block's elements.

    Element ``j`` of row ``i`` is element ``i * L + j`` of the flattened tensor (``L``
    elements per row); those in the block are kept, shifted by its start. Duplicate rows stay
    duplicates, in order (not summed): an optimizer that treats them apart (Adam squares each
    before they are summed) sees the block of what it sees of the whole tensor.
    """
    shape = tf.TensorShape(shape)
    width = shard_size(shape.num_elements(), num_replicas)
    length = shape[1:].num_elements()
    start = tf.cast(replica_id, tf.int64) * width
    rows = tf.cast(slices.indices, tf.int64)
    # Only the rows that reach into the block are spread into elements.
    touching = tf.logical_and(rows * length < start + width, (rows + 1) * length > start)
    values = tf.reshape(tf.boolean_mask(slices.values, touching), [-1])
    first = tf.boolean_mask(rows, touching) * length
    elements = tf.reshape(first[:, None] + tf.range(length, dtype=tf.int64)[None, :], [-1])
    inside = tf.logical_and(elements >= start, elements < start + width)
    return tf.IndexedSlices(
        tf.boolean_mask(values, inside),
        tf.boolean_mask(elements, inside) - start,
        tf.constant([width], tf.int64),
    )
