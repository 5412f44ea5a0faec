"""The gradient exchange: one all-reduce per update, optionally bucketed and in 16 bits.

Runs in replica context, once per optimizer update, on the locally summed
gradients (dense float tensors) and the local example count:

* **Unbucketed, 32-bit** (the default): one ``all_reduce`` of every gradient
  plus the count; the strategy packs them (MWMS: one collective).
* **Bucketed** (``bucket_bytes``): the gradients, in reverse variable order
  (the order the backward pass produces them), are packed into flat buckets of
  about ``bucket_bytes`` each; each bucket is one ``all_reduce`` of one tensor,
  so one collective, and depends only on its own gradients: the runtime can
  start it while the backward pass still computes earlier layers. The example
  count rides in the first bucket.
* **Compressed** (``gradient_compression``): each bucket travels as bf16 or
  fp16 and is cast back to float32 at once, so everything else (accumulation
  over micro-batches, the optimizer) stays float32. 16-bit floats cannot hold
  an example count exactly (bf16: integers up to 256), so with compression the
  count goes in a small float32 all-reduce of its own in the first bucket.
  fp16 (max 65504) is scaled so that the sum cannot overflow: each replica
  contributes its bucket's max-abs ``m_i`` to that float32 side all-reduce;
  ``S = sum_i m_i`` bounds the largest summed element, so scaling by the power
  of two ``2**floor(log2(2**14 / S))`` keeps every partial sum under ``2**15``
  (a factor two of margin for rounding in the log), and uses the 16-bit range
  fully, so small gradients do not flush to zero. Powers of two scale exactly.
  A non-finite ``S`` (an fp16 loss-scale overflow) gives scale 1, so the
  infinities reach the loss-scale optimizer, which skips that update. bf16 has
  float32's range and needs no scaling.

With one replica there is nothing to exchange: compression is not applied.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import tensorflow as tf

from tfdist.strategies import step_clock

Compression = Literal["bf16", "fp16"]
COMPRESSIONS = ("bf16", "fp16")
_WIRE_DTYPES = {"bf16": tf.bfloat16, "fp16": tf.float16}
_FP16_TARGET = 2.0**14  # the scaled sum stays below 2**15 < 65504


def buckets(grads: Sequence[tf.Tensor], bucket_bytes: int | None) -> list[list[int]]:
    """Indices of ``grads`` in reverse order, grouped into buckets of about ``bucket_bytes``.

    A bucket is closed once it holds at least ``bucket_bytes`` (so each holds
    at least one gradient, and few buckets are small); ``None``: one bucket.
    """
    order = list(reversed(range(len(grads))))
    if not bucket_bytes:
        return [order] if order else []
    groups: list[list[int]] = []
    size = 0
    for i in order:
        if not groups or size >= bucket_bytes:
            groups.append([])
            size = 0
        groups[-1].append(i)
        size += (grads[i].shape.num_elements() or 0) * grads[i].dtype.size
    return groups


def _fp16_scale(bound: tf.Tensor) -> tf.Tensor:
    exponent = tf.floor(tf.math.log(_FP16_TARGET / bound) / tf.math.log(2.0))
    exponent = tf.clip_by_value(exponent, -100.0, 100.0)  # float32 holds 2**±100
    usable = tf.logical_and(tf.math.is_finite(bound), bound > 0)
    return tf.where(usable, tf.pow(2.0, exponent), 1.0)


def all_reduce_sum(
    grads: Sequence[tf.Tensor],
    count: tf.Tensor,
    *,
    num_replicas: int,
    bucket_bytes: int | None = None,
    compression: str | None = None,
) -> tuple[list[tf.Tensor], tf.Tensor]:
    """Sums ``grads`` and ``count`` over all replicas; runs in replica context.

    Args:
        grads: Dense local gradient sums (any float dtype; packed as float32).
        count: The local example count, a float32 scalar.
        num_replicas: ``num_replicas_in_sync``.
        bucket_bytes: About how many bytes of gradients per all-reduce; ``None``
            for one all-reduce of everything.
        compression: ``"bf16"``, ``"fp16"`` or ``None`` (float32).

    Returns:
        The summed gradients (in their own dtypes) and the summed count.
    """
    ctx = tf.distribute.get_replica_context()
    step_clock.mark("compute", [grads, count])  # the straggler report's sections
    if num_replicas == 1:
        compression = None
    if bucket_bytes is None and compression is None:
        # The original exchange, bit for bit: the strategy packs the list itself.
        reduced = ctx.all_reduce(tf.distribute.ReduceOp.SUM, list(grads) + [count])
        step_clock.mark("exchange", reduced)
        return list(reduced[:-1]), reduced[-1]
    out: list[Any] = [None] * len(grads)
    total = None
    for b, indices in enumerate(buckets(grads, bucket_bytes)):
        parts = [grads[i] for i in indices]
        flat = tf.concat([tf.reshape(tf.cast(g, tf.float32), [-1]) for g in parts], axis=0)
        side = [count] if b == 0 else []  # the count rides in the first bucket (ready first)
        if compression is None:
            packed = tf.concat([flat] + [tf.reshape(c, [1]) for c in side], axis=0)
            reduced = ctx.all_reduce(tf.distribute.ReduceOp.SUM, packed)
            if side:
                total, reduced = reduced[-1], reduced[:-1]
        else:
            if compression == "fp16":
                side.append(
                    tf.reduce_max(tf.abs(flat)) if flat.shape.num_elements() else tf.constant(0.0)
                )
            scale = None
            if side:
                summed_side = ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.stack(side))
                if b == 0:
                    total = summed_side[0]
                if compression == "fp16":
                    scale = _fp16_scale(summed_side[-1])
            wire = tf.cast(flat if scale is None else flat * scale, _WIRE_DTYPES[compression])
            reduced = tf.cast(ctx.all_reduce(tf.distribute.ReduceOp.SUM, wire), tf.float32)
            if scale is not None:
                reduced = reduced / scale
        sizes = [g.shape.num_elements() for g in parts]
        for i, g, piece in zip(indices, parts, tf.split(reduced, sizes)):
            out[i] = tf.cast(tf.reshape(piece, tf.shape(g)), g.dtype)
    if total is None:  # no gradients at all
        total = ctx.all_reduce(tf.distribute.ReduceOp.SUM, count)
    step_clock.mark("exchange", [out, total])
    return out, total
