"""The Trainer's update on sharded parameters (ZeRO-3, ``sharding="parameters"``), and the
forward pass of evaluation inside a fit.

`ParametersUpdate` is `tfdist.training.step.update.TrainUpdate` with another micro-step and
another update (by way of `tfdist.training.zero.update.ShardedUpdate`, whose whole-tensor views
it shares: norm clipping on the whole tensors' norms):

- micro-step: the forward pass unit by unit on this replica's blocks
  (`tfdist.training.zero.units.Units`: each layer's weights gathered just before it; a nested
  functional model, a KerasHub backbone, runs layer by layer), an ``Embedding``'s sparse
  gradient kept sparse in its block (`BlockUnits`),
  the units' regularizers and ``add_loss`` terms entering Keras's loss as the layers' own
  (`tfdist._compat.keras_internals.unit_calls.losses_as`), the Trainer's objective
  (`tfdist.training.step.objective`: the loss normalised by the global batch, the loss tracker,
  the compiled metrics) and the blocks' gradients, which arrive reduce-scattered by the
  backward;
- the exchange is the identity on the blocks (only the example count is summed);
- accumulation sums the block gradients over the micro-batches;
- the update: the optimizer on the blocks (``clipnorm`` / ``global_clipnorm`` on the whole
  tensors' norms, one small all-reduce; the optimizer's own are off during a fit; under
  ``mixed_float16`` one finite decision for all replicas, so that all skip alike), then the
  constraints on the gathered wholes.

An empty replica batch (a partial last batch smaller than the replica count, or a worker's
padding) runs one all-zero example and keeps none of its outputs, as the plain step does: every
replica takes part in every gather.

Keras masks between layers travel between the units (`tfdist.training.zero.units`), and a
mask on an output reaches the loss, as in Keras's ``train_step``. A loss with masked terms
(``ignore_class``, a Keras mask on an output) is divided by the valid count of all replicas, as
unsharded (`tfdist.training.step.masked_losses`): each unit's backward reduce-scatters its
gradients at once, so the weights are known before it starts. The forward is whole by then: one
small all-reduce of the counts (the examples and each term's valid count) between the forward
and the backward, and one backward of the rest of the loss plus each term's weighted sum
``c_j * S_j`` times ``T / (D_j * expected)`` (`TermsWeighed`): after the update's
``expected / T`` correction, ``c_j * grad(S_j) / D_j``, the unsharded update's. With
``accumulation_steps > 1`` ``D_j`` counts every micro-batch of the update, known only after the
last forward, when each micro-batch's backward has run: a loss that is one masked term and
nothing else (no regularizer, no unmasked term) is differentiated unweighed and the update
weighs the blocks' summed gradients by ``T / (D * expected)`` (counts summed then); a masked
term beside others is refused, by name (`_check_deferred`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf
from keras.utils import unpack_x_y_sample_weight

from tfdist._compat.keras_internals.unit_calls import set_losses
from tfdist.config import invalid_argument
from tfdist.training.step.exchange import all_reduce_sum, sum_counts
from tfdist.training.step.gradients import scale_gradient
from tfdist.training.step.inference import make_eval_step
from tfdist.training.step.masked_losses import (
    MaskedUpdate,
    masked_means,
    output_sums,
    update_loss_log,
)
from tfdist.training.step.objective import Objective, record
from tfdist.training.step.update import batch_size_of
from tfdist.training.zero.layout import shard_size
from tfdist.training.zero.parameters import ParameterState, constrain
from tfdist.training.zero.per_layer import block_of_gradient
from tfdist.training.zero.state import elements
from tfdist.training.zero.units import Units, forward_and_objective, forward_never_empty
from tfdist.training.zero.update import ShardedUpdate


def _blocks(state: ParameterState) -> list[tf.Tensor]:
    """This replica's blocks, read now (replica context)."""
    return [tf.convert_to_tensor(b.value) for b in state.blocks]


class BlockUnits(Units):
    """`Units` whose sparse weight gradients stay sparse: an ``Embedding``'s rows gathered from
    every replica in its backward and cut to this replica's block, duplicates kept, as the
    unsharded exchange keeps them (Keras's Adam squares duplicate rows apart: their sum, dense,
    moved BERT's segment embedding 0.1 away from unsharded in two updates); summed into a dense
    block first with ``sparse="dense"``, as the unsharded exchange then sums them.

    Args:
        model: The model, its trainable variables cut (`ParameterState`).
        num_replicas: ``num_replicas_in_sync``.
        sparse_as_dense: ``ExchangeOptions(sparse="dense")``.
    """

    def __init__(
        self,
        model: Any,
        num_replicas: int,
        *,
        sparse_as_dense: bool,
        kept: frozenset[int],
        named: Any,
    ) -> None:
        super().__init__(model, num_replicas, kept=kept, named=named)
        self.sparse_as_dense = sparse_as_dense

    def _blocks_of(self, variables: list, grads: list) -> list:
        return [
            block_of_gradient(g, v.shape, self.num_replicas, self.sparse_as_dense)
            for g, v in zip(grads, variables)
        ]


class TermsWeighed(MaskedUpdate):
    """A masked loss's terms whose gradients the backward weighed already (`ParametersUpdate`):
    the update only logs them. One micro-batch's vector (`ParametersUpdate._weigh_terms`):
    ``[rest log, T, D (M), S (M), c*S (M)]``, ``T`` and ``D`` summed over the replicas; or,
    when ``deferred`` (accumulation, a lone masked term), this replica's, and the update weighs
    the summed gradients of ``c * S`` then.

    Args:
        deferred: ``accumulation_steps > 1``.
    """

    def __init__(self, *, deferred: bool) -> None:
        super().__init__()
        self.deferred = deferred

    @property
    def length(self) -> int:
        return 2 + 3 * self.terms if self.terms else 0

    def combine(
        self, model: Any, vector: tf.Tensor, summed: list[Any], count: tf.Tensor, *, expected: float
    ) -> tuple[list[Any], dict[int, tf.Tensor]]:
        """``summed`` as it is, and the logs as `MaskedUpdate.combine` makes them."""
        m = self.terms
        vector = tf.reshape(vector, [self.length])
        totals = sum_counts(vector[1 : 2 + m]) if self.deferred else vector[1 : 2 + m]
        total, counts = totals[0], tf.unstack(totals[1:])
        if self.deferred:  # the one term's gradient sum over D, in the update's scale
            ratio = tf.math.divide_no_nan(total, counts[0] * expected)
            summed = [scale_gradient(g, ratio) for g in summed]
        sums, weighted = tf.unstack(vector[2 + m : 2 + 2 * m]), tf.unstack(vector[2 + 2 * m :])
        update_loss_log(model, vector[0], weighted, counts, count, total)
        means = masked_means(count, total, sums, counts)
        return list(summed), {tracker: means[j] for tracker, j in self.trackers.items()}


def _check_deferred(loss: Objective, accumulation_steps: int) -> None:
    """Under accumulation, a masked term must be the loss's only term: each micro-batch's
    backward reduces its gradients into the blocks before the update's valid count is known,
    so the update can weigh one gradient sum, not a sum of terms each over its own count."""
    if loss.replica.only_masked and len(loss.replica.terms) == 1:
        return
    raise invalid_argument(
        "accumulation_steps",
        accumulation_steps,
        "1 with sharding='parameters' and a loss with masked terms beside other terms "
        "(several outputs, unmasked terms, regularizers, add_loss), or sharding=None or "
        "'optimizer'",
        note="A masked loss term (ignore_class, a Keras mask on an output) is divided by the "
        "valid count of the whole update; each micro-batch's backward reduces its gradients "
        "into the blocks before the later micro-batches are counted, so only a loss that is one "
        "masked term can be weighed at the update.",
    )


class ParametersUpdate(ShardedUpdate):
    """`TrainUpdate` on sharded parameters, in replica context (see the module docstring).

    Args:
        state: The blocks and the optimizer built on them.
        **kwargs: `TrainUpdate`'s arguments.
    """

    state: ParameterState

    def __init__(self, *args: Any, state: ParameterState, **kwargs: Any) -> None:
        super().__init__(*args, state=state, **kwargs)  # type: ignore[arg-type]
        self.units = BlockUnits(
            self.model,
            self.num_replicas,
            sparse_as_dense=self.sparse_as_dense,
            kept=state.kept_ids,
            named=state.units,
        )
        self.masked = TermsWeighed(deferred=self.accumulation_steps > 1)
        # The optimizer's own are off during a fit (`ParameterState.cut`): it sees blocks.
        self.clipnorm, self.global_clipnorm = state.clipping

    def _reduces_each_micro_batch(self) -> bool:
        return False  # the gradients are reduce-scattered by each micro-batch's backward

    def micro_step(self, data: Any) -> tuple[list[Any], tf.Tensor, list[tf.Tensor], tf.Tensor]:
        """Forward unit by unit, loss, metrics and the blocks' gradients of one micro-batch."""
        model = self.model
        x, y, sample_weight = unpack_x_y_sample_weight(data)
        size = batch_size_of(x)
        blocks = _blocks(self.state)
        # Persistent: a masked term's coefficient is read from it as well (`objective`).
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(blocks)
            data = (x, y, sample_weight, size)
            y_pred, loss = forward_and_objective(self.units, self, data, blocks, tape)
        weights, packed = self._weigh_terms(loss, size)
        grads = tape.gradient(loss.targets, blocks, output_gradients=weights)  # one backward
        del tape
        self.units.write_updates()
        record(model, loss, (x, y, y_pred, sample_weight), size)
        if not self.present:
            self._learn(loss.replica, grads, [])
        self.fill_in(grads)
        return grads, size, output_sums(model, loss.replica, size), packed

    def _weigh_terms(self, loss: Objective, size: tf.Tensor) -> tuple[list, tf.Tensor]:
        """Each of ``loss.targets``' weight in the backward (1 for the rest of the loss,
        ``T / (D_j * expected)`` for masked term ``j``: ``T`` examples and ``D_j`` valid ones,
        summed over the replicas by one small all-reduce), and the masked terms' logs, packed
        for `TermsWeighed` (empty without masked terms)."""
        weights = [tf.ones_like(loss.targets[0])]
        if loss.parts is None:
            return weights, tf.zeros([0])
        parts = loss.parts
        totals = tf.stack([size, *parts.counts])
        if self.masked.deferred:
            _check_deferred(loss, self.accumulation_steps)
            weights += [tf.ones_like(loss.targets[1])]  # weighed by the update (`TermsWeighed`)
        else:
            totals = sum_counts(totals)
            counts = tf.unstack(totals[1:])
            ratios = [tf.math.divide_no_nan(totals[0], d * self.expected) for d in counts]
            weights += [tf.cast(r, t.dtype) for r, t in zip(ratios, loss.targets[1:])]
        rest_log = tf.reshape(tf.cast(loss.rest_log, tf.float32), [1])
        sums = tf.cast(tf.stack(parts.sums), tf.float32)
        weighted = tf.cast(tf.stack([c * s for c, s in parts.weighted()]), tf.float32)
        return weights, tf.concat([rest_log, totals, sums, weighted], axis=0)

    def _shard_zeros(self, i: int) -> tf.Tensor:
        v = self.state.variables[i]
        if i in self.state.kept:
            return tf.zeros(v.shape, v.dtype)
        return tf.zeros([shard_size(elements(v.shape), self.num_replicas)], v.dtype)

    def fill_in(self, grads: list[Any]) -> None:
        """A zero block for each present variable without a gradient."""
        for i in self.present:
            if grads[i] is None:
                grads[i] = self._shard_zeros(i)

    def zeros(self) -> Any:
        """The accumulation loop's starting state: sums of blocks (`TrainUpdate.zeros`'s order)."""
        _, count, sums, extra = super().zeros()
        return [self._shard_zeros(i) for i in range(len(self.state.blocks))], count, sums, extra

    def exchange(self, summed: Sequence[Any], count: tf.Tensor) -> tuple[list[Any], tf.Tensor]:
        """The blocks' gradients are summed over the replicas already: only the count is, and
        the kept variables' whole gradients with it (in the buckets of the unsharded exchange)."""
        kept = [k for k, i in enumerate(self.present) if i in self.state.kept]
        if not kept:
            ctx = tf.distribute.get_replica_context()
            return list(summed), ctx.all_reduce(tf.distribute.ReduceOp.SUM, count)
        variables = self.state.variables
        whole = [
            g if isinstance(g, tf.IndexedSlices) else tf.ensure_shape(g, variables[i].shape)
            for g, i in ((summed[k], self.present[k]) for k in kept)
        ]
        reduced, total = all_reduce_sum(
            whole,
            count,
            num_replicas=self.num_replicas,
            bucket_bytes=self.bucket_bytes,
            compression=self.gradient_compression,
            clock=False,
        )
        out = list(summed)
        for k, g in zip(kept, reduced):
            out[k] = g
        return out, total

    def update(self, grads: Sequence[Any]) -> None:
        """The optimizer on this replica's blocks (norm clipping on the whole tensors' norms),
        then the constraints on the gathered wholes (a kept variable's: by the optimizer)."""
        blocks = [self.state.blocks[i] for i in self.present]
        replicated = [k for k, i in enumerate(self.present) if i in self.state.kept]
        grads = self._whole_tensor_views(list(grads), replicated=replicated)
        self.optimizer.apply(grads, blocks)
        constrain(self.state)


def make_parameters_eval_step(state: ParameterState) -> Callable[[Sequence[Any]], None]:
    """`tfdist.training.step.inference.make_eval_step` on sharded parameters: each batch's
    forward pass unit by unit (``training=False``), outside the step's cond on empty batches
    (every replica takes part in every gather), its units' loss terms in Keras's loss and their
    non-trainable variables' writes made (a call counter's, as Keras's evaluate makes them)."""
    model = state.model
    units = Units(model, state.num_replicas, kept=state.kept_ids, named=state.units)
    held = threading.local()  # one replica's (MirroredStrategy traces them in threads)

    def forward(x: Any, training: bool) -> Any:
        set_losses(model, held.terms)  # read by the step's loss, next (no collective between)
        return held.y_pred

    inner = make_eval_step(model, forward_fn=forward)

    def step(batches: Sequence[Any]) -> None:
        try:
            for data in batches:
                x, _, _ = unpack_x_y_sample_weight(data)
                held.y_pred = forward_never_empty(units, x, _blocks(state), training=False)
                held.terms = units.loss_terms()
                units.write_updates()  # outside the cond too (a merge_call for a counter's)
                inner([data])
        finally:
            set_losses(model, [])

    return step
