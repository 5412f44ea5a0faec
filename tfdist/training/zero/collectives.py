"""The collectives of a sharded update (ZeRO-1/2), in buckets of bounded size, one at a time.

`reduce_scatter` sums gradients over the replicas, each replica keeping its block of each
(`tfdist.training.zero.layout`): it cuts the block layout ``[N, S]`` of each tensor into column
chunks and packs them into buckets of about ``bucket_bytes`` (a large variable spans several
buckets, small ones share one), starting a bucket only once the previous one is done, so the
exchange never holds more than about two buckets of summed gradients. `gather_into` writes
every replica's updated blocks into every replica's whole variables, each variable whole by
one dense assign (small ones share a bucket), one bucket at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tfdist.strategies import step_clock
from tfdist.training.step.exchange import all_reduce_sum
from tfdist.training.zero.layout import blocks, shard_size, unblock

#: A chunk of tensor ``i``'s block layout: columns ``start`` to ``end`` of its ``[N, S]``.
Chunk = tuple[int, int, int]


def plan(
    widths: Sequence[int],
    dtypes: Sequence[tf.DType],
    rows: int,
    bucket_bytes: int,
    *,
    reverse: bool = False,
    align: Sequence[int] | None = None,
) -> list[list[Chunk]]:
    """Buckets of chunks of ``[rows, widths[i]]`` tensors, each bucket of one dtype and at
    most about ``bucket_bytes`` (a chunk is at least one column, or ``align[i]`` columns, a
    multiple of which each chunk starts at); the last tensors first with ``reverse`` (the
    order in which backpropagation makes gradients)."""
    buckets: list[list[Chunk]] = []
    size, dtype = 0, None
    order = range(len(widths) - 1, -1, -1) if reverse else range(len(widths))
    for i in order:
        item = tf.as_dtype(dtypes[i]).size * rows
        unit = align[i] if align else 1
        step = max(unit, bucket_bytes // item // unit * unit)
        for start in range(0, widths[i], step):
            end = min(widths[i], start + step)
            nbytes = (end - start) * item
            if not buckets or dtypes[i] != dtype or (size and size + nbytes > bucket_bytes):
                buckets.append([])
                size, dtype = 0, dtypes[i]
            buckets[-1].append((i, start, end))
            size += nbytes
    return buckets


def _after(tensors: Sequence[tf.Tensor]) -> Any:
    """A scope whose ops wait for ``tensors``: the next bucket after the previous one."""
    return tf.control_dependencies(list(tensors))


def _replica_id() -> tf.Tensor:
    return tf.distribute.get_replica_context().replica_id_in_sync_group


def _columns(tensor: tf.Tensor, start: int, end: int, width: int, axis: int) -> tf.Tensor:
    if (start, end) == (0, width):
        return tensor
    return tensor[start:end] if axis == 0 else tensor[:, start:end]


def _joined(parts: list[tf.Tensor], axis: int) -> tf.Tensor:
    return parts[0] if len(parts) == 1 else tf.concat(parts, axis=axis)


def reduce_scatter(
    grads: Sequence[Any],
    count: tf.Tensor,
    *,
    shapes: Sequence[Any],
    num_replicas: int,
    bucket_bytes: int,
    compression: str | None,
) -> tuple[list[tf.Tensor], tf.Tensor]:
    """``grads`` summed over the replicas, this replica keeping its ``[S]`` block of each,
    and ``count`` summed (it rides in the first bucket); replica context.

    One all-reduce per bucket (on CPU a reduce-scatter is an all-reduce and a slice, the
    only form of it that ``tf.distribute`` offers), 16-bit with ``compression``. The block
    layout comes from ``shapes`` (each gradient's variable's shape): a gradient's own static
    shape may be partly unknown (a ``Dense`` kernel's on 3-D input is ``(None, units)``).
    """
    n = num_replicas
    grads = [tf.ensure_shape(tf.convert_to_tensor(g), s) for g, s in zip(grads, shapes)]
    step_clock.mark("compute", [grads, count])  # the straggler report's sections
    widths = [shard_size(elements(s), n) for s in shapes]
    layouts: dict[int, tf.Tensor] = {}
    pieces: list[list[tf.Tensor]] = [[] for _ in grads]
    total, last = None, []
    buckets = plan(widths, [g.dtype for g in grads], n, bucket_bytes, reverse=True)
    for b, bucket in enumerate(buckets):
        with _after(last):
            for i, _, _ in bucket:
                if i not in layouts:
                    layouts[i] = blocks(grads[i], n)  # [N, S]: a view unless padded
            packed = _joined([_columns(layouts[i], s, e, widths[i], 1) for i, s, e in bucket], 1)
        (summed,), bucket_total = all_reduce_sum(
            [packed],
            count if b == 0 else None,
            num_replicas=n,
            compression=compression,
            clock=False,
        )
        total = bucket_total if b == 0 else total
        mine = tf.gather(summed, _replica_id())
        last = tf.split(mine, [e - s for _, s, e in bucket]) if len(bucket) > 1 else [mine]
        for (i, _, _), piece in zip(bucket, last):
            pieces[i].append(piece)
    if total is None:  # no gradients at all
        total = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, count)
    out = [_joined(p, 0) for p in pieces]
    step_clock.mark("exchange", [out, total])
    return out, total


def elements(shape: Any) -> int:
    """The number of elements of a fully known ``shape``."""
    return tf.TensorShape(shape).num_elements()


def _assign_all(strategy: tf.distribute.Strategy, values: Any, *, targets: list) -> None:
    """Cross-replica: each replica's copy of each ``targets[i]`` takes its ``values[i]``."""
    for target, value in zip(targets, values):
        strategy.extended.update(target, lambda var, x: var.assign(x), args=(value,), group=False)


#: The integer type of each float type's bits, for an exact gather by all-reduce.
_BITS = {tf.float32: tf.int32, tf.float64: tf.int64}


def all_rows(mine: tf.Tensor, num_replicas: int) -> tf.Tensor:
    """Every replica's ``[S]`` ``mine`` as the rows of ``[N, S]``, bit for bit (replica context).

    A 32- or 64-bit float block is placed in zeros at its replica's row, its bits summed as
    integers over the replicas (``x + 0 == x`` for every bit pattern, ``-0.0`` and NaNs too):
    about two whole sizes in flight. ``ReplicaContext.all_gather`` (other dtypes) pads,
    gathers and concatenates again: about three.
    """
    ctx = tf.distribute.get_replica_context()
    bits = _BITS.get(mine.dtype)
    if bits is None:
        return ctx.all_gather(tf.reshape(mine, [1, -1]), axis=0)
    r = tf.cast(ctx.replica_id_in_sync_group, tf.int32)
    placed = tf.pad(
        tf.reshape(tf.bitcast(mine, bits), [1, -1]), [[r, num_replicas - 1 - r], [0, 0]]
    )
    return tf.bitcast(ctx.all_reduce(tf.distribute.ReduceOp.SUM, placed), mine.dtype)


def gather_into(
    new_blocks: Sequence[tf.Tensor],
    targets: Sequence[Any],
    constraints: Sequence[Any],
    *,
    num_replicas: int,
    bucket_bytes: int,
    after: Sequence[tf.Tensor] = (),
) -> None:
    """Every replica's ``[S]`` blocks, all-gathered, written into every replica's copy of
    ``targets`` (whole variables), each by one dense assign of its whole value (replica
    context). A Keras ``constraint`` (``constraints[i]``, or None) applies to the whole tensor,
    as Keras's optimizer applies it after an update.

    Small variables share one gather (`all_rows`, up to about ``bucket_bytes``); a larger one
    is gathered alone and whole, never in column chunks (its chunks and their concatenation would
    be alive together: twice its size). The next bucket starts once the previous one is
    written. Never a slice assign: after one, a TF variable copies itself on every later dense
    read, for good (a whole copy of each weight from the forward to its backward). The first
    bucket starts once ``after`` exists (the optimizer's update of every block: its
    temporaries and the gradients it reads are freed before the gathers' buffers exist).
    """
    ctx = tf.distribute.get_replica_context()
    widths = [b.shape.num_elements() for b in new_blocks]
    done: list[tf.Tensor] = list(after)
    dtypes = [b.dtype for b in new_blocks]
    # Aligned to its own width, each variable is one chunk: whole in one bucket.
    for bucket in plan(widths, dtypes, num_replicas, bucket_bytes, align=widths):
        indices = [i for i, _, _ in bucket]
        with _after(done):
            # A data edge (an identity made here) orders the collective, which MirroredStrategy
            # builds in a merge_call on another thread, out of this thread's control scope.
            packed = tf.concat([new_blocks[i] for i in indices], 0)
        rows = all_rows(packed, num_replicas)  # [N, sum of the S]
        split = tf.split(rows, [widths[i] for i in indices], axis=1) if len(indices) > 1 else [rows]
        whole = [unblock(part, targets[i].shape) for i, part in zip(indices, split)]
        whole = [w if constraints[i] is None else constraints[i](w) for i, w in zip(indices, whole)]
        written = [targets[i] for i in indices]
        ctx.merge_call(_assign_all, args=(whole,), kwargs={"targets": written})
        # Reads after the assigns (automatic control dependencies order them): the next
        # bucket starts once these are written and their values freed.
        done = [tf.reshape(t.read_value(), [-1])[:1] for t in written]
