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
mask on an output reaches the loss, as in Keras's ``train_step``. Refused here, by name: a loss
with masked terms (``ignore_class``, a Keras mask on an output), which weighs each gradient by
a global valid count the blocks do not carry.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf
from keras.utils import unpack_x_y_sample_weight

from tfdist._compat.keras_internals.unit_calls import set_losses
from tfdist.config import invalid_argument
from tfdist.training.step.inference import make_eval_step
from tfdist.training.step.masked_losses import output_sums
from tfdist.training.step.objective import record
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

    def __init__(self, model: Any, num_replicas: int, *, sparse_as_dense: bool) -> None:
        super().__init__(model, num_replicas)
        self.sparse_as_dense = sparse_as_dense

    def _blocks_of(self, op: Any, grads: list) -> list:
        return [
            block_of_gradient(g, v.shape, self.num_replicas, self.sparse_as_dense)
            for g, v in zip(grads, op.trainable_variables)
        ]


class ParametersUpdate(ShardedUpdate):
    """`TrainUpdate` on sharded parameters, in replica context (see the module docstring).

    Args:
        state: The blocks and the optimizer built on them.
        **kwargs: `TrainUpdate`'s arguments.
    """

    state: ParameterState

    def __init__(self, *args: Any, state: ParameterState, **kwargs: Any) -> None:
        super().__init__(*args, state=state, **kwargs)  # type: ignore[arg-type]
        self.units = BlockUnits(self.model, self.num_replicas, sparse_as_dense=self.sparse_as_dense)
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
        with tf.GradientTape() as tape:
            tape.watch(blocks)
            data = (x, y, sample_weight, size)
            y_pred, loss = forward_and_objective(self.units, self, data, blocks, tape)
        if loss.parts is not None:
            raise invalid_argument(
                "sharding",
                "parameters",
                "None, 'optimizer' or 'gradients' for a loss with masked terms",
                note="A masked loss term (ignore_class, a Keras mask on an output) weighs each "
                "gradient by the update's valid count over all replicas; the sharded "
                "parameters' backward reduces each layer's gradients before that is known.",
            )
        grads = tape.gradient(loss.targets[0], blocks)
        self.units.write_updates()
        record(model, loss, (x, y, y_pred, sample_weight), size)
        if not self.present:
            self._learn(loss.replica, grads, [])
        self.fill_in(grads)
        return grads, size, output_sums(model, loss.replica, size), tf.zeros([0])

    def _shard_zeros(self, i: int) -> tf.Tensor:
        v = self.state.variables[i]
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
        """The blocks' gradients are summed over the replicas already: only the count is."""
        ctx = tf.distribute.get_replica_context()
        return list(summed), ctx.all_reduce(tf.distribute.ReduceOp.SUM, count)

    def update(self, grads: Sequence[Any]) -> None:
        """The optimizer on this replica's blocks (norm clipping on the whole tensors' norms),
        then the constraints on the gathered wholes."""
        blocks = [self.state.blocks[i] for i in self.present]
        grads = self._whole_tensor_views(list(grads))
        self.optimizer.apply(grads, blocks)
        constrain(self.state)


def make_parameters_eval_step(state: ParameterState) -> Callable[[Sequence[Any]], None]:
    """`tfdist.training.step.inference.make_eval_step` on sharded parameters: each batch's
    forward pass unit by unit (``training=False``), outside the step's cond on empty batches
    (every replica takes part in every gather), its units' loss terms in Keras's loss and their
    non-trainable variables' writes made (a call counter's, as Keras's evaluate makes them)."""
    model, units = state.model, Units(state.model, state.num_replicas)
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
