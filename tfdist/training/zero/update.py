"""The update on sharded optimizer state (ZeRO-1/2), in replica context: see
`tfdist.training.zero.state` for the design; this module holds its step.

`ShardedUpdate` is `tfdist.training.step.update.TrainUpdate` with another exchange (each replica
keeps its block of each summed gradient) and another update (the optimizer on the blocks,
then an all-gather of the updated blocks into every replica's whole variables).

A sparse gradient (``tf.IndexedSlices``, an ``Embedding``'s) is not summed but gathered
(`tfdist.training.step.exchange.gather_slices`: every replica's rows, duplicates kept), and each
replica keeps the elements of those rows that fall in its block (`block_slices`): its optimizer
gets ``tf.IndexedSlices`` over its master shard, the block of what Keras's gets on one device.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import keras
import tensorflow as tf

from tfdist.config import invalid_argument
from tfdist.training.step.exchange import gather_slices
from tfdist.training.step.gradients import (
    SparseGradientsFound,
    add_gradients,
    dense_part,
    scale_gradient,
)
from tfdist.training.step.update import TrainUpdate
from tfdist.training.zero.collectives import gather_into, reduce_scatter
from tfdist.training.zero.layout import block, block_slices, shard_size
from tfdist.training.zero.per_layer import per_layer_for
from tfdist.training.zero.state import GATHER_BUCKET_BYTES, ShardedState, elements, inner_optimizer

_CLIPPING_LOCK = threading.Lock()
_CLIPPING_OFF: dict[int, list] = {}  # id(optimizer) -> [replica threads inside, saved values]


@contextlib.contextmanager
def _no_clipping(optimizer: keras.optimizers.Optimizer) -> Iterator[None]:
    """The optimizer's norm clipping off while it updates blocks (done before, on whole norms).

    MirroredStrategy traces each replica in a thread of its own: the first replica in turns
    clipping off, the last one out restores it.
    """
    with _CLIPPING_LOCK:
        entry = _CLIPPING_OFF.setdefault(id(optimizer), [0, None])
        if entry[0] == 0:
            entry[1] = optimizer.clipnorm, optimizer.global_clipnorm
            optimizer.clipnorm = optimizer.global_clipnorm = None
        entry[0] += 1
    try:
        yield
    finally:
        with _CLIPPING_LOCK:
            entry[0] -= 1
            if entry[0] == 0:
                optimizer.clipnorm, optimizer.global_clipnorm = entry[1]
                del _CLIPPING_OFF[id(optimizer)]


def _after(tensors: Sequence[tf.Tensor]) -> Any:
    return tf.control_dependencies(list(tensors))


def _replica_id() -> tf.Tensor:
    return tf.distribute.get_replica_context().replica_id_in_sync_group


class ShardedUpdate(TrainUpdate):
    """`TrainUpdate` on sharded optimizer state: its exchange and its update (replica context).

    Args:
        state: The master shards and the optimizer built on them.
        **kwargs: `TrainUpdate`'s arguments.
    """

    def __init__(self, *args: Any, state: ShardedState, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.state = state
        inner = inner_optimizer(self.optimizer)
        # Read once: while replicas trace, `_no_clipping` turns the optimizer's own off.
        self.clipnorm, self.global_clipnorm = inner.clipnorm, inner.global_clipnorm
        self.per_layer = per_layer_for(self)  # ZeRO-2's exchange inside the backward, or None
        # Per replica trace (MirroredStrategy traces each replica in a thread of its own).
        self._local = threading.local()

    def _per_layer(self) -> bool:
        return self.per_layer is not None and not self.per_layer.off

    def micro_step(self, data: Any) -> tuple[list[Any], tf.Tensor, list[tf.Tensor], tf.Tensor]:
        """`TrainUpdate.micro_step`; under the per-layer exchange its gradients are this
        replica's blocks, summed over the replicas by the backward pass already."""
        if self._per_layer():
            step = self.per_layer.micro_step(data)  # type: ignore[union-attr]
            if step is not None:
                return step
        return super().micro_step(data)

    def exchange(self, summed: Sequence[Any], count: tf.Tensor) -> tuple[list[Any], tf.Tensor]:
        """Each replica's blocks of the summed gradients, and the summed count.

        Both modes exchange in the block layout, one bucket at a time: no replica holds
        more than about two buckets of summed gradients at once. (``"optimizer"`` differs
        from ``"gradients"`` under accumulation: it sums whole micro-batch gradients locally
        and exchanges once per update.)
        """
        return self.reduce_scatter(summed, count)

    def reduce_scatter(self, grads: Sequence[Any], count: tf.Tensor) -> tuple[list[Any], tf.Tensor]:
        """``grads`` (the present variables') summed over the replicas, each replica keeping its
        block (ZeRO-2), and ``count`` summed.

        Dense gradients go in buckets of about the exchange's ``bucket_bytes`` (else
        `GATHER_BUCKET_BYTES`), laid out by their variables' shapes; a ``tf.IndexedSlices`` one
        is gathered, and this replica keeps its block of it as element slices (`_my_slices`).
        """
        dense = [k for k, g in enumerate(grads) if not isinstance(g, tf.IndexedSlices)]
        mine, total = self._scatter(
            [grads[k] for k in dense], count, [self.present[k] for k in dense]
        )
        out = list(grads)
        for k, piece in zip(dense, mine):
            out[k] = piece
        for k in range(len(grads)):
            if k not in dense:
                out[k] = self._my_slices(grads[k], self.state.variables[self.present[k]].shape)
        return out, total

    def _scatter(
        self, grads: list[Any], count: tf.Tensor, indices: list[int]
    ) -> tuple[list[tf.Tensor], tf.Tensor]:
        """`reduce_scatter` of the dense ``grads`` of variables ``indices``, in buckets (under
        the per-layer exchange they are blocks already: only ``count`` is summed)."""
        if self._per_layer():
            ctx = tf.distribute.get_replica_context()
            return list(grads), ctx.all_reduce(tf.distribute.ReduceOp.SUM, count)
        return reduce_scatter(
            grads,
            count,
            shapes=[self.state.variables[i].shape for i in indices],
            num_replicas=self.num_replicas,
            bucket_bytes=self.bucket_bytes or GATHER_BUCKET_BYTES,
            compression=self.gradient_compression,
        )

    def _my_slices(self, slices: tf.IndexedSlices, shape: tf.TensorShape) -> tf.IndexedSlices:
        """Every replica's rows of ``slices``, as this replica's element slices of its block
        (under the per-layer exchange they are those already)."""
        if self._per_layer():
            return slices
        n = self.num_replicas
        return block_slices(gather_slices(slices, n), shape, n, _replica_id())

    def _reduces_each_micro_batch(self) -> bool:
        return self.state.sharding == "gradients" and self.accumulation_steps > 1

    def __call__(self, micro_batches: Sequence[Any]) -> None:
        """One update; under ``"gradients"`` each micro-batch is reduced into the blocks' sum
        (a sparse gradient's rows are kept until the update, as `TrainUpdate` keeps them).

        Under the per-layer exchange the master shards are copied from the whole variables
        first (`_copy_masters`), while nothing but the kept state is alive: the forward's
        stand-ins read them, so the backward starts once every copy is written.
        """
        at_start = self._per_layer()
        if at_start:
            self._copy_masters(range(len(self.state.variables)), [])
        self._local.masters_copied = at_start  # read by `update`, in this replica's trace
        try:
            if not self._reduces_each_micro_batch():
                super().__call__(micro_batches)
                return
            state = None
            for data in micro_batches:
                state = self._reduce_into(self._micro_step(data), state)
            self.finish(state)
        finally:
            self._local.masters_copied = False

    def zeros(self) -> Any:
        """The accumulation state, in `tfdist.training.step.update.State`'s order; under
        ``"gradients"``: sums of blocks, and in place of the masked terms (which it refuses),
        the count summed over the replicas."""
        if not self._reduces_each_micro_batch():
            return super().zeros()
        _, count, output_sums, _ = super().zeros()
        n = self.num_replicas
        variables = self.model.trainable_variables
        shards = [tf.zeros([shard_size(elements(v.shape), n)], v.dtype) for v in variables]
        return shards, count, output_sums, tf.constant(0.0)

    def accumulate(self, data: Any, state: Any) -> Any:
        """``state`` plus one micro-batch; under ``"gradients"`` reduced into blocks at once."""
        if not self._reduces_each_micro_batch():
            return super().accumulate(data, state)
        step = self._micro_step(data)
        if any(isinstance(g, tf.IndexedSlices) for g in step[0]):
            raise SparseGradientsFound()  # rows of unknown count: cross_replica unrolls
        return self._reduce_into(step, state)

    def _micro_step(self, data: Any) -> tuple:
        """`micro_step`, its sparse gradients summed into dense ones with ``sparse="dense"``."""
        grads, size, losses, packed = self.micro_step(data)
        if self.sparse_as_dense:
            grads = [g if g is None else tf.convert_to_tensor(g) for g in grads]
        return grads, size, losses, packed

    def _reduce_into(self, step: tuple, state: Any) -> Any:
        """``state`` (None: zeros) plus one micro-batch's ``step`` (`micro_step`'s outputs): its
        dense gradients reduce-scattered into the blocks' sums, its sparse ones' rows kept."""
        grads, size, losses, packed = step
        if packed.shape[0]:
            raise invalid_argument(
                "sharding",
                "gradients",
                "'optimizer' or None for a loss with masked terms and accumulation_steps > 1",
                note="A masked loss weighs each micro-batch by the update's valid count, "
                "which needs the whole gradients of every micro-batch until the update.",
            )
        sums, count, output_sums, total = self.zeros() if state is None else state
        sums = list(sums)
        dense = [i for i in self.present if not isinstance(grads[i], tf.IndexedSlices)]
        mine, summed = self._scatter([grads[i] for i in dense], size, dense)
        for i, piece in zip(dense, mine):
            sums[i] = sums[i] + tf.cast(piece, sums[i].dtype)
        for i in self.present:
            if i not in dense:  # the first micro-batch's rows replace the zeros
                kept = sums[i] if isinstance(sums[i], tf.IndexedSlices) else None
                sums[i] = grads[i] if kept is None else add_gradients(kept, grads[i])
        return sums, count + size, [a + b for a, b in zip(output_sums, losses)], total + summed

    def finish(self, state: Any) -> None:
        """The update from the accumulated ``state`` (a sparse gradient's rows gathered now)."""
        if not self._reduces_each_micro_batch():
            super().finish(state)
            return
        sums, count, output_sums, total = tf.nest.map_structure(
            tf.identity, state, expand_composites=True
        )
        variables = self.state.variables
        blocks_ = [
            self._my_slices(sums[i], variables[i].shape)
            if isinstance(sums[i], tf.IndexedSlices)
            else sums[i]
            for i in self.present
        ]
        self.apply(blocks_, count, output_sums, tf.zeros([0]), total=total)

    def update(self, grads: Sequence[Any]) -> None:
        """The optimizer on this replica's blocks, then the whole variables from every block."""
        state, n = self.state, self.num_replicas
        variables = [state.variables[i] for i in self.present]
        masters = [state.masters[i] for i in self.present]
        if not getattr(self._local, "masters_copied", False):
            # After the exchange (else the copies run during the backward pass, beside its
            # whole gradients, and raise the step's peak).
            self._copy_masters(self.present, [dense_part(g) for g in grads])
        grads = self._whole_tensor_views(list(grads))
        inner = inner_optimizer(self.optimizer)
        with _no_clipping(inner):
            self.optimizer.apply(grads, masters)
        # Read after the optimizer's update (automatic control dependencies order them).
        updated = [tf.convert_to_tensor(m.value) for m in masters]
        gather_into(
            updated,
            [v.value for v in variables],
            [v.constraint for v in variables],
            num_replicas=n,
            bucket_bytes=GATHER_BUCKET_BYTES,
            after=updated,  # every block updated (the optimizer's temporaries gone) first
        )

    def _copy_masters(self, indices: Sequence[int], after: list[tf.Tensor]) -> None:
        """Master shards ``indices`` take this replica's block of their whole variables (which
        a callback, a restore or a constraint may have changed), once ``after`` exists; one
        block after the other, so that their copies do not pile up (replica context)."""
        state, copied = self.state, list(after)
        for i in indices:
            with _after(copied):
                copied = [block(state.variables[i].value, self.num_replicas, _replica_id())]
            state.masters[i].assign(copied[0])

    def _whole_tensor_views(
        self, grads: list[tf.Tensor], replicated: Sequence[int] = ()
    ) -> list[tf.Tensor]:
        """Norm clipping on the whole tensors' norms, and one finite decision for all replicas.
        ``replicated``: positions of gradients every replica holds whole (counted once).

        One small all-reduce of each block's squared norm (when clipping) and of the count of
        non-finite blocks (when loss scaling), so that every replica clips and skips alike. A
        ``tf.IndexedSlices`` block's norm is its values' (duplicates apart), as Keras's is.
        """
        clip = self.clipnorm or self.global_clipnorm
        scaling = self.skipped_updates is not None
        if not clip and not scaling:
            return grads
        values = [dense_part(g) for g in grads]
        side = [tf.reduce_sum(tf.square(tf.cast(v, tf.float32))) for v in values] if clip else []
        if clip and replicated:  # the first replica's alone
            first = tf.cast(tf.equal(_replica_id(), 0), tf.float32)
            side = [s * first if k in replicated else s for k, s in enumerate(side)]
        if scaling:
            finite_here = tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in values])
            side.append(tf.cast(tf.logical_not(finite_here), tf.float32))
        summed = tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, tf.stack(side)
        )
        if clip:
            norms = tf.sqrt(summed[: len(grads)])
            grads = _clipped(grads, norms, self.clipnorm, self.global_clipnorm, self.optimizer)
        if scaling:
            finite = summed[-1] == 0
            self.skipped_updates.assign_add(tf.cast(tf.logical_not(finite), tf.int64))
            # The loss-scale optimizer checks the blocks it is given: all skip, or none.
            grads = [_nan_unless(finite, g) for g in grads]
        return grads


def _nan_unless(finite: tf.Tensor, g: Any) -> Any:
    """``g`` where ``finite``, else NaN, dense or ``tf.IndexedSlices``."""
    values = dense_part(g)
    values = tf.where(finite, values, tf.constant(float("nan"), values.dtype))
    if isinstance(g, tf.IndexedSlices):
        return tf.IndexedSlices(values, g.indices, g.dense_shape)
    return values


def _clipped(
    grads: list, norms: tf.Tensor, clipnorm: float | None, global_clipnorm: float | None, opt: Any
) -> list:
    """Keras's ``clipnorm`` / ``global_clipnorm`` on the whole tensors' ``norms``."""
    scale = getattr(opt, "dynamic_scale", None)  # a loss-scale optimizer clips unscaled values
    if scale is not None:
        norms = norms / tf.cast(scale, tf.float32)
    if clipnorm:
        clip = tf.constant(float(clipnorm))
        factors = [clip / tf.maximum(norms[i], clip) for i in range(len(grads))]
    else:
        clip = tf.constant(float(global_clipnorm))
        norm = tf.sqrt(tf.reduce_sum(tf.square(norms)))
        factors = [clip * tf.minimum(1.0 / norm, 1.0 / clip)] * len(grads)
        # Keras multiplies each gradient by the factor with ``*``, which makes a
        # ``tf.IndexedSlices`` dense (duplicate rows summed): its optimizer then gets it dense.
        grads = [tf.convert_to_tensor(g) for g in grads]
    return [scale_gradient(g, f) for g, f in zip(grads, factors)]
