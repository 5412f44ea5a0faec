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
  over micro-batches, the optimizer) stays float32. Each gradient is cast
  before the bucket is packed, so the packing copies 16-bit values.
  bf16 holds every integer up to 256 exactly, so under bf16 the example count
  rides in the first bucket as base-``b`` digits, with ``b`` chosen so that the
  digits summed over all replicas stay within 256 (``count_digits``): exact,
  and no second collective. Beyond 256 replicas, and under fp16, the count goes
  in a small float32 all-reduce of its own in the first bucket.
  fp16 (max 65504) is scaled so that the sum cannot overflow: each replica
  contributes its bucket's max-abs ``m_i`` to that float32 side all-reduce;
  ``S = sum_i m_i`` bounds the largest summed element, so scaling by the power
  of two ``2**floor(log2(2**14 / S))`` keeps every partial sum under ``2**15``
  (a factor two of margin for rounding in the log), and uses the 16-bit range
  fully, so small gradients do not flush to zero. Powers of two scale exactly.
  A non-finite ``S`` (an fp16 loss-scale overflow) gives scale 1, so the
  infinities reach the loss-scale optimizer, which skips that update. bf16 has
  float32's range and needs no scaling.

With one replica there is nothing to exchange: compression and buckets are not applied,
and the chief logs that once (`log_nothing_to_exchange`).

**Sparse gradients** (``tf.IndexedSlices``, as an ``Embedding`` lookup gives them) are not
summed but gathered (`gather_slices`): every replica's rows, in replica order, duplicates kept,
exactly the slices one device computes on the whole global batch. Keras's optimizers treat
duplicate rows nonlinearly (Adam squares each row before duplicates are summed), so summing
them first would change the weights. They travel in their own dtype, outside the buckets and
compression (logged when compression is asked for); `sparse_bytes` counts what they send.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any, Literal

import tensorflow as tf

from tfdist.strategies import step_clock

Compression = Literal["bf16", "fp16"]
COMPRESSIONS = ("bf16", "fp16")
_WIRE_DTYPES = {"bf16": tf.bfloat16, "fp16": tf.float16}
_FP16_TARGET = 2.0**14  # the scaled sum stays below 2**15 < 65504
_BF16_EXACT = 256  # bf16 (8 significant bits) holds every integer up to 2**8 exactly
_COUNT_BITS = 24  # float32 holds every integer up to 2**24 exactly: the count's range

logger = logging.getLogger(__name__)


def log_nothing_to_exchange(compression: str | None, bucket_bytes: int | None, runner: Any) -> None:
    """Logs (chief) that ``gradient_compression``/``bucket_bytes`` do nothing with one replica
    in sync: no gradient is all-reduced, so none is compressed or bucketed."""
    asked = [
        f"{name}={value!r}"
        for name, value in (("gradient_compression", compression), ("bucket_bytes", bucket_bytes))
        if value is not None
    ]
    if asked and runner.is_chief and runner.strategy.num_replicas_in_sync == 1:
        logger.warning(
            "%s shape the all-reduce between replicas; this strategy has 1 replica in sync, "
            "so no gradient is exchanged and the gradients stay as computed.",
            " and ".join(asked),
        )


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


def count_digits(num_replicas: int) -> tuple[int, int] | None:
    """``(base, digits)`` that carry an example count exactly in bf16 over ``num_replicas``.

    Each digit is below ``base``, so a digit summed over every replica (and every
    partial sum on the way) is at most ``num_replicas * (base - 1) <= 256``: exact
    in bf16. ``digits`` cover counts below ``2**24``; the top digit takes the rest.
    ``None`` beyond 256 replicas (no base of at least 2 fits).
    """
    base = _BF16_EXACT // num_replicas + 1
    if base < 2:
        return None
    return base, math.ceil(_COUNT_BITS / math.log2(base))


def encode_count(count: tf.Tensor, base: int, digits: int) -> tf.Tensor:
    """An integer-valued float32 count as ``digits`` bf16 base-``base`` digits, lowest first."""
    whole = tf.cast(tf.round(count), tf.int64)
    parts = [tf.math.floormod(tf.math.floordiv(whole, base**j), base) for j in range(digits - 1)]
    parts.append(tf.math.floordiv(whole, base ** (digits - 1)))
    return tf.cast(tf.stack(parts), tf.bfloat16)


def decode_count(summed: tf.Tensor, base: int) -> tf.Tensor:
    """The summed count from its summed digits (each an exact integer)."""
    powers = tf.constant([float(base**j) for j in range(summed.shape[0])], tf.float64)
    return tf.cast(tf.reduce_sum(tf.cast(summed, tf.float64) * powers), tf.float32)


def gather_slices(slices: tf.IndexedSlices, num_replicas: int | None = None) -> tf.IndexedSlices:
    """Every replica's rows of ``slices``, concatenated in replica order; replica context.

    Indices and values are all-gathered (replicas may hold different numbers of rows);
    duplicate rows are kept, so the result is the ``tf.IndexedSlices`` that one device
    computes on the whole global batch.
    """
    ctx = tf.distribute.get_replica_context()
    n = ctx.num_replicas_in_sync if num_replicas is None else num_replicas
    if n == 1:
        return slices
    return _gather_rows(ctx, slices)


def _gather_rows(ctx: tf.distribute.ReplicaContext, slices: tf.IndexedSlices) -> tf.IndexedSlices:
    """All-gather of rows of uneven counts: the counts first, then rows padded to the largest."""
    values, indices = slices.values, tf.cast(slices.indices, tf.int64)
    rows = tf.shape(indices, tf.int64)[0]
    counts = ctx.all_gather(tf.reshape(rows, [1]), axis=0)  # [N]
    longest = tf.reduce_max(counts)
    pad = longest - rows
    padded_values = tf.pad(values, [[0, pad]] + [[0, 0]] * (values.shape.rank - 1))
    gathered_values = ctx.all_gather(padded_values, axis=0)  # [N * longest, ...]
    gathered_indices = ctx.all_gather(tf.pad(indices, [[0, pad]]), axis=0)
    keep = tf.reshape(tf.sequence_mask(counts, longest), [-1])
    return tf.IndexedSlices(
        tf.boolean_mask(gathered_values, keep),
        tf.cast(tf.boolean_mask(gathered_indices, keep), slices.indices.dtype),
        slices.dense_shape,
    )


def sparse_bytes(slices: tf.IndexedSlices) -> tf.Tensor:
    """Bytes one replica sends of ``slices`` in `gather_slices`: its rows' values and indices
    (int64) and its row count, a float32 scalar."""
    rows = tf.cast(tf.shape(slices.indices)[0], tf.float32)
    width = tf.cast(tf.reduce_prod(tf.shape(slices.values)[1:]), tf.float32)
    return rows * (width * slices.values.dtype.size + 8.0) + 8.0


def all_reduce_sum(
    grads: Sequence[Any],
    count: tf.Tensor | None,
    *,
    num_replicas: int,
    bucket_bytes: int | None = None,
    compression: str | None = None,
    clock: bool = True,
) -> tuple[list[tf.Tensor], tf.Tensor | None]:
    """Sums ``grads`` and ``count`` over all replicas; runs in replica context.

    Args:
        grads: Local gradient sums (any float dtype; packed as float32); a
            ``tf.IndexedSlices`` entry is gathered (`gather_slices`), not summed.
        count: The local example count, a float32 scalar (None: no count, none returned).
        num_replicas: ``num_replicas_in_sync``.
        bucket_bytes: About how many bytes of gradients per all-reduce; ``None``
            for one all-reduce of everything.
        compression: ``"bf16"``, ``"fp16"`` or ``None`` (float32).
        clock: Mark the straggler report's compute and exchange sections (False: a part of
            an exchange that its caller marks).

    Returns:
        The summed gradients (in their own dtypes) and the summed count.
    """
    if any(isinstance(g, tf.IndexedSlices) for g in grads):
        return _with_slices(grads, count, num_replicas, bucket_bytes, compression, clock)
    ctx = tf.distribute.get_replica_context()
    if clock:
        step_clock.mark("compute", [grads, count])  # the straggler report's sections
    if num_replicas == 1:
        compression = None
    side = [] if count is None else [count]
    if bucket_bytes is None and compression is None:
        # The original exchange, bit for bit: the strategy packs the list itself.
        reduced = ctx.all_reduce(tf.distribute.ReduceOp.SUM, list(grads) + side)
        if clock:
            step_clock.mark("exchange", reduced)
        return list(reduced[: len(grads)]), (reduced[-1] if side else None)
    out: list[Any] = [None] * len(grads)
    total = None
    for b, indices in enumerate(buckets(grads, bucket_bytes)):
        parts = [grads[i] for i in indices]
        first = count if b == 0 else None  # the count rides in the first bucket (ready first)
        if compression is None:
            pieces, summed = _reduce_float32(ctx, parts, first)
        else:
            pieces, summed = _reduce_16bit(ctx, parts, first, compression, num_replicas)
        total = summed if b == 0 else total
        for i, piece in zip(indices, pieces):
            out[i] = piece
    if total is None and count is not None:  # no gradients at all
        total = ctx.all_reduce(tf.distribute.ReduceOp.SUM, count)
    if clock:
        step_clock.mark("exchange", [out, total])
    return out, total


def _with_slices(
    grads: Sequence[Any],
    count: tf.Tensor | None,
    num_replicas: int,
    bucket_bytes: int | None,
    compression: str | None,
    clock: bool,
) -> tuple[list[Any], tf.Tensor | None]:
    """`all_reduce_sum` of dense gradients beside gathered ``tf.IndexedSlices`` ones."""
    sparse = [i for i, g in enumerate(grads) if isinstance(g, tf.IndexedSlices)]
    dense = [i for i in range(len(grads)) if i not in sparse]
    if compression is not None and num_replicas > 1:
        logger.warning(
            "gradient_compression=%r applies to the dense gradients; the %d sparse ones "
            "(embedding rows) are gathered in their own dtype. ExchangeOptions(sparse='dense') "
            "sums them into dense gradients, which are compressed.",
            compression,
            len(sparse),
        )
    if clock:
        step_clock.mark("compute", [[_values(g) for g in grads], count])
    summed, total = all_reduce_sum(
        [grads[i] for i in dense],
        count,
        num_replicas=num_replicas,
        bucket_bytes=bucket_bytes,
        compression=compression,
        clock=False,
    )
    out: list[Any] = [None] * len(grads)
    for i, g in zip(dense, summed):
        out[i] = g
    for i in sparse:
        out[i] = gather_slices(grads[i], num_replicas)
    if clock:
        step_clock.mark("exchange", [[_values(g) for g in out], total])
    return out, total


def _values(g: Any) -> Any:
    return g.values if isinstance(g, tf.IndexedSlices) else g


def _reduce_float32(
    ctx: tf.distribute.ReplicaContext, parts: list[tf.Tensor], count: tf.Tensor | None
) -> tuple[list[tf.Tensor], tf.Tensor | None]:
    """One float32 bucket (plus ``count`` as its last element): one collective."""
    flat = [tf.reshape(tf.cast(g, tf.float32), [-1]) for g in parts]
    side = [] if count is None else [tf.reshape(count, [1])]
    reduced = ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.concat(flat + side, axis=0))
    total = None
    if count is not None:
        total, reduced = reduced[-1], reduced[:-1]
    return _unpack(reduced, parts), total


def _reduce_16bit(
    ctx: tf.distribute.ReplicaContext,
    parts: list[tf.Tensor],
    count: tf.Tensor | None,
    compression: str,
    num_replicas: int,
) -> tuple[list[tf.Tensor], tf.Tensor | None]:
    """One bucket on a 16-bit wire; the count as bf16 digits or in a float32 side all-reduce."""
    digits = count_digits(num_replicas) if compression == "bf16" and count is not None else None
    side = [count] if count is not None and digits is None else []
    as_float = [tf.cast(g, tf.float32) for g in parts]
    if compression == "fp16":
        # An empty gradient has no max; one of unknown static size (None) is kept.
        maxima = [tf.reduce_max(tf.abs(g)) for g in as_float if g.shape.num_elements() != 0]
        side.append(tf.reduce_max(tf.stack(maxima)) if maxima else tf.constant(0.0))
    scale = total = None
    if side:
        summed_side = ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.stack(side))
        total = summed_side[0] if count is not None and digits is None else None
        scale = _fp16_scale(summed_side[-1]) if compression == "fp16" else None
    wire_dtype = _WIRE_DTYPES[compression]
    wire = [
        tf.reshape(tf.cast(g if scale is None else g * scale, wire_dtype), [-1]) for g in as_float
    ]
    if digits is not None:
        wire.append(encode_count(count, *digits))
    reduced = ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.concat(wire, axis=0))
    if digits is not None:
        total = decode_count(reduced[-digits[1] :], digits[0])
        reduced = reduced[: -digits[1]]

    def widen(piece: tf.Tensor) -> tf.Tensor:
        piece = tf.cast(piece, tf.float32)
        return piece if scale is None else piece / scale

    return _unpack(reduced, parts, widen), total


def _unpack(
    reduced: tf.Tensor, parts: list[tf.Tensor], widen: Any = lambda piece: piece
) -> list[tf.Tensor]:
    """``reduced`` split back into ``parts``' shapes and dtypes (``widen`` each piece first)."""
    # Sizes from the tensors themselves: a gradient's static shape may be partly unknown (a
    # Dense kernel's on 3-D input is (None, units) as traced).
    sizes = [tf.size(g) for g in parts]
    return [
        tf.cast(tf.reshape(widen(piece), tf.shape(g)), g.dtype)
        for g, piece in zip(parts, tf.split(reduced, sizes))
    ]


def sum_counts(counts: tf.Tensor) -> tf.Tensor:
    """A float32 vector of counts summed over all replicas (one small all-reduce), replica context.

    Masked loss terms need their global valid counts before their gradients join the
    exchange (`tfdist.training.step.masked_losses`).
    """
    ctx = tf.distribute.get_replica_context()
    return ctx.all_reduce(tf.distribute.ReduceOp.SUM, counts)
