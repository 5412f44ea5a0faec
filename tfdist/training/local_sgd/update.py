"""`LocalUpdate`: the replica step of local SGD, `TrainUpdate` without the gradient exchange.

Each replica's gradients stay its own: `exchange` returns them unreduced with the local example
count, so `TrainUpdate.apply`'s correction ``expected / count`` turns the loss normalised by the
global batch into the mean over this replica's own examples (exactly what one replica training
alone on its batches computes). The inner optimizer then updates this replica's copy only
(tf.distribute updates each replica's component with its own gradient), and a ``merge_call``
hands `tfdist.training.local_sgd.sync.LocalState.maybe_sync` the cross-replica context in which
a sync may run every ``sync_every`` updates.

Masked loss terms (Keras masks, ``ignore_class``) weigh by this replica's own valid counts (no
all-reduce of counts): each replica's gradient is the mean over its own valid terms, as one
replica training alone on its batches computes; the ``loss`` log is each replica's own mean,
weighted by its examples when the replicas' trackers are summed.

With ``adapt_to_stragglers`` (`tfdist.training.local_sgd.stragglers`) the update is driven from
cross-replica context (`LocalUpdate.cross_replica`): a ``tf.cond`` on this worker's
`LocalState.takes_step` computes the gradients (forward and backward of the micro-batches,
unrolled, timed to the gradients), or zero gradients of no examples (the batches, read before
it, dropped). A sparse gradient (an ``Embedding``'s ``tf.IndexedSlices``) stays rows, as plain
local SGD hands it to the optimizer (Adam squares each row before duplicates are summed): the
cond carries its values, indices and dense shape, and a skip's zero gradient is one of no rows;
so with equal rates adapting is plain local SGD bit for bit, transformers included. The
branches hold no collective, so the workers may take different ones. The optimizer's update
then runs on every worker (Keras's ``optimizer.iterations`` is an ``only_first_replica``
variable: its increment is a collective on ``multi_worker``, which must not sit in one branch
only) and a skipping worker puts its parameters and inner slots back
(`LocalState.undo_where_skipped`, a copy of them per update); the sync follows. The cond sits
in cross-replica context because replica context refuses a ``merge_call`` (the optimizer's)
inside a ``tf.cond``'s branch. So an update called in replica context (data of unknown
length, the straggler report's timed calls) is refused when adapting.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import keras
import tensorflow as tf

from tfdist.config import invalid_argument
from tfdist.strategies import step_clock
from tfdist.training.local_sgd.sync import LocalState
from tfdist.training.step.update import TrainUpdate


class LocalUpdate(TrainUpdate):
    """One inner update on this replica's batches, then maybe a sync (replica context).

    Args:
        model: As for `TrainUpdate`.
        optimizer: The inner optimizer.
        state: The local-SGD state (`LocalState`), built in the scope.
        **kwargs: `TrainUpdate`'s other arguments.
    """

    def __init__(
        self,
        model: keras.Model,
        optimizer: keras.optimizers.Optimizer,
        *,
        state: LocalState,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, optimizer, **kwargs)
        self.state = state
        self.masked.local = True  # each replica's masked terms over its own valid counts
        self._driven = False  # whether `cross_replica` is tracing the update (adapting)
        self._row_specs: list[Any] = []  # adapting: each present sum's kind (`_rows_spec`)

    def exchange(self, summed: Sequence[Any], count: tf.Tensor) -> tuple[list[Any], tf.Tensor]:
        """No exchange: this replica's gradient sums and example count as they are."""
        step_clock.mark("compute", [list(summed), count])
        return list(summed), count

    def update(self, grads: Sequence[Any]) -> None:
        """The inner optimizer's update of this replica's copy, then the sync when due (adapting:
        `cross_replica` syncs)."""
        super().update(grads)
        if self.state.adaptive:
            if not self._driven:
                raise invalid_argument(
                    "local_sgd",
                    self.state.options,
                    "adapt_to_stragglers=False here",
                    note="Adapting to stragglers skips updates from the train loop; this update "
                    "runs inside a replica call (data of unknown length: give steps_per_epoch; "
                    "or the straggler report's timed calls: stragglers=None).",
                )
            return
        iterations = tf.convert_to_tensor(self.optimizer.iterations)
        synced = tf.distribute.get_replica_context().merge_call(
            lambda strategy: self.state.maybe_sync(strategy, iterations)
        )
        # The straggler report's exchange section: the inner update and, at a sync, the wait
        # for the other workers and the all-reduce.
        step_clock.mark("exchange", synced)

    def cross_replica(self, run: Callable[..., Any], next_batch: Callable[[], Any]) -> None:
        """One loop iteration from cross-replica context: adapting, this worker's gradients or
        none (`_gradients`), the optimizer's update on every worker, undone where skipped, then
        the sync when due; else `TrainUpdate`'s."""
        if not self.state.adaptive:
            super().cross_replica(run, next_batch)
            return
        take = self.state.takes_step()
        kept = self.state.kept(self.optimizer)
        state = self._gradients(take, run, next_batch, kept)
        self._driven = True
        try:
            run(self._apply, (state,))  # on every worker: Keras's update syncs its iterations
        finally:
            self._driven = False
        self.state.undo_where_skipped(take, kept)
        iterations = tf.convert_to_tensor(self.optimizer.iterations)
        self.state.maybe_sync(self.state.strategy, iterations)

    def _gradients(
        self, take: tf.Tensor, run: Callable[..., Any], next_batch: Callable[[], Any], kept: Any
    ) -> Any:
        """This worker's micro-batches' state, unrolled (`_unrolled`; timed from the batches and
        the parameters before it, ``kept``, to the gradients), or, skipping, nothing
        (`_nothing`): the batches are read before the cond on every worker (on ``multi_worker``
        a read is a collective: whether every worker still has data), so neither branch holds
        one. Unrolled, the first trace learns the masked terms and sparse rows (no retrace)."""
        batches = [next_batch() for _ in range(self.accumulation_steps)]

        def step() -> Any:
            # After the previous update too: in a loop of several updates a batch may be ready
            # while the previous update still waits for the others (its iterations' collective).
            started = step_clock.timestamp_after([batches, [values for _, values in kept]])
            with tf.control_dependencies([started]):
                state = run(self._unrolled, (batches,))
            computed = step_clock.timestamp_after(state)
            self.state.record_step(computed - started)
            return state

        # The true branch is traced first: `_nothing` follows what `_unrolled` learned.
        return tf.cond(take, step, lambda: run(self._nothing, ()))

    def _unrolled(self, batches: Sequence[Any]) -> Any:
        """`unrolled` (replica context: each sparse sum's rows concatenated, as plain local SGD
        keeps them), each sparse sum as its ``(values, indices, dense shape)``: a masked loss's
        rows stacked beside them (`stack_term_rows`) make no ``IndexedSlices`` a cond's or a
        per-replica value's type spec accepts."""
        sums, *rest = self.unrolled(batches)
        self._row_specs = [_rows_spec(g) for g in sums]
        parts = [
            g if spec is None else (g.values, g.indices, g.dense_shape)
            for g, spec in zip(sums, self._row_specs)
        ]
        return parts, *rest

    def _nothing(self) -> Any:
        """A skipped update's state (replica context), in `_unrolled`'s structure: zeros, each
        sparse sum of no rows (a skip's zero gradient has no rows)."""
        _, count, output_sums, extra = self.zeros()
        variables = self.model.trainable_variables
        sums = [
            tf.zeros(variables[i].shape, variables[i].dtype)
            if spec is None
            else _no_rows(spec, variables[i].shape)
            for i, spec in zip(self.present, self._row_specs)
        ]
        return sums, count, output_sums, extra

    def _apply(self, state: Any) -> None:
        """The update from `_unrolled`'s ``state`` (replica context), as `finish` from a
        loop's."""
        parts, *rest = tf.nest.map_structure(tf.identity, state)
        sums = [
            g if spec is None else tf.IndexedSlices(*g) for g, spec in zip(parts, self._row_specs)
        ]
        self.apply(sums, *rest)


def _rows_spec(g: Any) -> tuple[tf.TensorShape, tf.DType, tf.DType, tf.DType] | None:
    """A sparse sum's kind: its values' row shape and dtype, its indices' and dense shape's
    dtypes (None: a dense sum)."""
    if not isinstance(g, tf.IndexedSlices):
        return None
    return g.values.shape[1:], g.values.dtype, g.indices.dtype, g.dense_shape.dtype


def _no_rows(spec: tuple[tf.TensorShape, tf.DType, tf.DType, tf.DType], shape: Any) -> tuple:
    """``(values, indices, dense shape)`` of no rows, of `_rows_spec`'s kind, for a variable of
    ``shape``."""
    row, dtype, index_dtype, shape_dtype = spec
    return (
        tf.zeros([0, *row], dtype),
        tf.zeros([0], index_dtype),
        tf.constant(list(shape), shape_dtype),
    )
