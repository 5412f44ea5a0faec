"""ZeRO-2's exchange inside the backward pass, one top-level layer at a time (``sharding=
"gradients"`` on a model with a functional graph), in replica context.

The model's weights stay whole in its Keras variables (mirrored); what changes is when the
gradients are summed. Each top-level layer with trainable variables (a "unit") runs inside a
``tf.custom_gradient`` (`tfdist.training.zero.units.Units`, whose gather is here a read of the
whole variables, `WholeUnits`): its backward, once the upstream gradient exists, reads the
weights again, recomputes the unit's forward under a tape, takes the input gradient first,
then the weight gradients, and reduce-scatters each of them there and then (this replica keeps
its block); the unit's input gradient waits for that, so at most one unit's whole gradients
exist at a time, where the whole-model backward held them all until its buckets went.

The custom gradient hands each block to the outer tape as the gradient of a stand-in input of
the block's shape: this replica's master shard, read (`PerLayer.micro_step`). The rest of the
update is `tfdist.training.zero.update.ShardedUpdate`'s: the blocks (summed over the
micro-batches under accumulation), the master copy after the exchange, the optimizer on the
master shards, the all-gather into the whole variables.

Same numbers as the whole-model exchange: each element of a block is the same sum of the same
replicas' values (bit for bit at 2 replicas; at 3 and more an all-reduce may add them in
another order when its chunks differ). A unit's weight regularizers and ``add_loss`` terms are
computed inside it and enter Keras's loss as the layers' own
(`tfdist._compat.keras_internals.unit_calls.losses_as`), so a regularized weight's gradient is
still one local sum before it is exchanged. An ``Embedding``'s ``tf.IndexedSlices`` gradient
has its rows gathered in the backward and cut to this replica's block, duplicates kept (or,
with ``sparse="dense"``, summed into a dense one first), as the whole-model exchange does it.
A gradient that reaches a variable outside its layer (a layer reading another layer's weight)
is reduce-scattered after the backward and added to its block, and so are the gradients of a
small layer at a branch of the graph (a pre-norm transformer's ``LayerNormalization`` beside
its residual), which runs on the step's tape, not as a unit
(`tfdist.training.zero.units.on_the_tape`: as a unit it summed its own contributions to its
input before the residual's, a rounding off the whole model's backward).

Today's whole-model exchange stays (with a log line, `per_layer_for`) for a model without a
functional graph (subclassed), 16-bit gradient compression, Keras masks between layers, an
overridden ``compute_loss``, a loss with masked terms (``ignore_class``: found at the first
trace) and the hybrid's stages.
"""

from __future__ import annotations

import logging
from typing import Any

import keras
import tensorflow as tf
from keras.utils import unpack_x_y_sample_weight

from tfdist._compat.keras_internals.unit_calls import functional_graph
from tfdist.training.step.exchange import gather_slices
from tfdist.training.step.gradients import add_gradients
from tfdist.training.step.masked_losses import output_sums
from tfdist.training.step.model_steps import overridden
from tfdist.training.step.objective import record
from tfdist.training.step.update import batch_size_of
from tfdist.training.zero.layout import block_slices
from tfdist.training.zero.units import Units, forward_and_objective, reduce_scatter_one

logger = logging.getLogger(__name__)


def _replica_id() -> tf.Tensor:
    return tf.distribute.get_replica_context().replica_id_in_sync_group


def block_of_gradient(g: Any, shape: Any, num_replicas: int, sparse_as_dense: bool) -> Any:
    """The whole local gradient ``g`` of a variable of ``shape`` summed over the replicas, this
    replica keeping its ``[S]`` block: dense, or the ``tf.IndexedSlices`` of its block's
    elements among every replica's rows (duplicates kept)."""
    n = num_replicas
    if isinstance(g, tf.IndexedSlices) and not sparse_as_dense:
        return block_slices(gather_slices(g, n), shape, n, _replica_id())
    return reduce_scatter_one(tf.ensure_shape(tf.convert_to_tensor(g), shape), n)


class WholeUnits(Units):
    """`Units` on whole weights: each unit reads its Keras variables (no gather) and its
    weight gradients are summed into this replica's blocks in its backward.

    Args:
        model: A built functional or Sequential model, its variables whole.
        num_replicas: ``num_replicas_in_sync``.
        sparse_as_dense: Sum a ``tf.IndexedSlices`` gradient's rows into a dense one first.
    """

    def __init__(self, model: keras.Model, num_replicas: int, *, sparse_as_dense: bool) -> None:
        super().__init__(model, num_replicas)
        self.sparse_as_dense = sparse_as_dense

    def _gathered(self, op: Any, blocks: list, after: list) -> list[tf.Tensor]:
        """``op``'s whole weights, read once ``after`` exists (``blocks``: stand-ins, unread)."""
        with tf.control_dependencies([t for t in after if t is not None]):
            return [tf.convert_to_tensor(v.value) for v in op.trainable_variables]

    def _whole_on_tape(self, variable: Any, block: tf.Tensor, after: list) -> tf.Tensor:
        """A layer on the step's tape (`Units.plain`) reads ``variable`` itself: its gradient
        reaches the variable, and is reduce-scattered after the backward (`PerLayer`)."""
        return tf.convert_to_tensor(variable.value)

    def _blocks_of(self, variables: list, grads: list) -> list:
        return [
            block_of_gradient(g, v.shape, self.num_replicas, self.sparse_as_dense)
            for g, v in zip(grads, variables)
        ]


class PerLayer:
    """The micro-step of a `tfdist.training.zero.update.ShardedUpdate` under ``"gradients"``
    with each unit's gradients reduce-scattered in its backward.

    Attributes:
        off: Set at the first trace that finds masked loss terms: the update takes today's
            whole-model exchange from then on.
    """

    def __init__(self, update: Any) -> None:
        self.update = update
        self.units = WholeUnits(
            update.model, update.num_replicas, sparse_as_dense=update.sparse_as_dense
        )
        self.off = False

    def micro_step(self, data: Any) -> tuple | None:
        """`TrainUpdate.micro_step`'s outputs with the gradients as this replica's blocks,
        summed over the replicas; None (and `off`) for a loss with masked terms."""
        u, model = self.update, self.update.model
        x, y, sample_weight = unpack_x_y_sample_weight(data)
        size = batch_size_of(x)
        stand_ins = [tf.convert_to_tensor(m.value) for m in u.state.masters]
        variables = u.state.variables
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(stand_ins)
            data = (x, y, sample_weight, size)
            y_pred, loss = forward_and_objective(self.units, u, data, stand_ins, tape)
        if loss.parts is not None:
            self.off = True
            _log("a loss with masked terms (ignore_class, a Keras mask on an output)")
            return None
        both = tape.gradient(loss.targets[0], stand_ins + variables)
        del tape
        grads = self._with_stray(both[: len(variables)], both[len(variables) :])
        self.units.write_updates()
        record(model, loss, (x, y, y_pred, sample_weight), size)
        if not u.present:
            u._learn(loss.replica, grads, [])
        return grads, size, output_sums(model, loss.replica, size), tf.zeros([0])

    def _with_stray(self, grads: list, stray: list) -> list:
        """The blocks plus the blocks of gradients that reached a variable outside its layer."""
        u, out = self.update, list(grads)
        for i, g in enumerate(stray):
            if g is None:
                continue
            shape = u.state.variables[i].shape
            piece = block_of_gradient(g, shape, u.num_replicas, u.sparse_as_dense)
            out[i] = piece if out[i] is None else add_gradients(out[i], piece)
        return out


def _mask_makers(model: keras.Model) -> list[str]:
    """The layers of ``model`` (nested ones too) that make Keras masks."""
    found, layers = [], list(model.layers)
    while layers:
        layer = layers.pop()
        if getattr(layer, "mask_zero", False) or isinstance(layer, keras.layers.Masking):
            found.append(layer.name)
        layers.extend(getattr(layer, "layers", None) or [])
    return found


def whole_model_reason(update: Any) -> str | None:
    """Why ``update``'s model keeps today's whole-model exchange, or None."""
    model = update.model
    if functional_graph(model) is None or not model.built:
        return f"{type(model).__name__} {model.name!r} has no functional graph (subclassed)"
    if update.gradient_compression is not None:
        return f"gradient_compression={update.gradient_compression!r}"
    masks = _mask_makers(model)
    if masks:
        return f"Keras masks between layers (made by {sorted(masks)})"
    if overridden(model, "compute_loss"):
        return "an overridden compute_loss"
    return None


def per_layer_for(update: Any) -> PerLayer | None:
    """The per-layer exchange of ``update`` (a `ShardedUpdate`), or None: not ``"gradients"``,
    the hybrid (a pipeline's ``stages``: its own micro-step), or `whole_model_reason` (logged)."""
    if getattr(update.state, "sharding", None) != "gradients" or hasattr(update, "stages"):
        return None
    reason = whole_model_reason(update)
    if reason is not None:
        _log(reason)
        return None
    return PerLayer(update)


def _log(reason: str) -> None:
    logger.info(
        "sharding='gradients': the gradients are reduce-scattered after the whole backward "
        "pass, not each layer's inside it, for %s.",
        reason,
    )
