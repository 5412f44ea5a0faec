"""Sharded optimizer state saved whole: backups and ``.keras`` files stay consolidated.

Under ``ExchangeOptions(sharding=...)`` each optimizer slot is a per-replica
(``SyncOnRead``) variable holding one ``[S]`` block of the whole tensor
(`tfdist.training.zero.layout`). A plain ``tf.train.Checkpoint`` of such a
variable silently saves one replica's block, and Keras's
``Optimizer.save_own_variables`` writes that block too. Here:

- `ConsolidatedShard` is what a checkpoint tracks instead of the slot: it saves
  the whole tensor (the replicas' blocks all-gathered, padding cut, reshaped),
  under the key a plain variable of an unsharded run has, and restores by giving
  each local replica its block for the current replica count. So a sharded
  run's backup is an unsharded run's format, and either resumes as the other,
  on any replica count. It copies itself to the host for TF's asynchronous
  checkpoints (`tfdist._compat.tf_internals.whole_tensor`, which holds TF's private hooks).
- Under ``sharding="parameters"`` the model's trainable variables are blocks too during a fit:
  a backup tracks a `ConsolidatedShard` of each block under the whole variable's key
  (`tfdist.training.zero.parameters.ParameterState.in_checkpoint`), so its backups are an
  unsharded run's format as well.
- `save_whole` makes the optimizer's ``save_own_variables`` and
  ``load_own_variables`` (``model.save``, ``keras.saving.load_model``,
  ``load_weights``) write and read the whole tensors alike. A file with another count of
  optimizer variables (a weights-only file holds none) loads the model's weights and skips the
  optimizer's with Keras's own warning, as plain Keras does.

Saving all-gathers: on a multi-worker run every worker saves (as tfdist's
backups and ``tfdist train`` do), or the chief waits for the others.

Memory: an asynchronous backup (the Trainer's default) gathers each variable whole and copies
it into its host copy (TF's asynchronous checkpoint keeps one per variable, unsharded too), in
TF's compiled copy function: a whole tensor lives until its copy is made, and TF may run a few
gathers side by side. A synchronous one hands TF's saver every whole tensor at once (one save
op): while it writes, a worker holds the whole weights and slots beside its blocks.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import tensorflow as tf

from tfdist._compat.tf_internals.whole_tensor import WholeTensor
from tfdist.training.zero.layout import blocks, unblock


def local_replica_ids(strategy: tf.distribute.Strategy) -> list[int]:
    """The global replica id of each of this process's replicas, in local order."""

    @tf.function
    def replica_ids() -> Any:
        return strategy.run(lambda: tf.distribute.get_replica_context().replica_id_in_sync_group)

    return [int(i) for i in strategy.experimental_local_results(replica_ids())]


class ConsolidatedShard(WholeTensor):
    """A sharded slot (or ZeRO-3 block) as a checkpoint sees it: one whole tensor.

    Args:
        variable: The per-replica TF variable of ``[S]`` elements (one block per replica).
        full_shape: The shape of the whole tensor (the unsharded variable or slot).
        strategy: The strategy whose replicas hold the blocks.
        replica_ids: `local_replica_ids` of ``strategy``.
    """

    def __init__(
        self,
        variable: Any,
        full_shape: Any,
        strategy: tf.distribute.Strategy,
        replica_ids: list[int],
    ) -> None:
        self.variable = variable
        self.full_shape = tf.TensorShape(full_shape)
        self._strategy = strategy
        self._replica_ids = replica_ids
        # Traced once and reused by every save (eager gathers would trace one function each).
        self._gather = tf.function(self._gather_now, autograph=False)

    def _gather_now(self) -> tf.Tensor:
        return unblock(self._strategy.gather(self.variable, axis=0), self.full_shape)

    def whole(self) -> tf.Tensor:
        """The whole tensor: every replica's block, gathered (a collective on every worker)."""
        return self._gather()

    def assign_whole(self, value: Any) -> Any:
        """Gives each local replica its block of ``value`` (the whole tensor)."""
        value = tf.convert_to_tensor(value, dtype=self.variable.dtype)
        if not value.shape.is_compatible_with(self.full_shape):
            raise ValueError(
                f"Cannot restore the sharded variable {self.variable.name!r}: "
                f"Received: a saved value of shape {value.shape}. Expected: the shape of the "
                f"whole variable, {self.full_shape}."
            )
        rows = blocks(value, self._strategy.num_replicas_in_sync)
        components = self._strategy.experimental_local_results(self.variable)
        assigned = []
        for component, replica in zip(components, self._replica_ids):
            with tf.device(component.device):
                assigned.append(component.assign(rows[replica]))
        return tf.group(assigned)


def consolidated(
    variables: list, full_shapes: dict[int, Any], strategy: tf.distribute.Strategy
) -> list:
    """``variables`` (TF variables) with each sharded one (its ``id`` in ``full_shapes``)
    replaced by its `ConsolidatedShard`."""
    if not full_shapes:
        return list(variables)
    ids = local_replica_ids(strategy)
    return [
        ConsolidatedShard(v, full_shapes[id(v)], strategy, ids) if id(v) in full_shapes else v
        for v in variables
    ]


def _skip_loading(name: str, held: int, saved: int) -> None:
    """Warns as Keras's ``Optimizer.load_own_variables`` does when a file holds another count of
    optimizer variables (a weights-only file holds none), and loads nothing into the optimizer:
    the model's weights still load."""
    msg = (
        f"Skipping variable loading for optimizer '{name}', "
        f"because it has {held} variables whereas "
        f"the saved optimizer has {saved} variables. "
    )
    if held == 0:
        msg += "This is likely because the optimizer has not been called/built yet."
    warnings.warn(msg, stacklevel=3)


def save_whole(optimizers: list, full_shapes: dict[int, Any], strategy: Any) -> None:
    """Makes each optimizer's ``save_own_variables`` / ``load_own_variables`` (``.keras``
    files, ``load_weights``) write and read sharded slots as whole tensors."""
    ids = local_replica_ids(strategy)

    def shards_of(optimizer: Any) -> list:
        return [
            ConsolidatedShard(v.value, full_shapes[id(v.value)], strategy, ids)
            if id(getattr(v, "value", None)) in full_shapes
            else v
            for v in optimizer.variables
        ]

    for optimizer in optimizers:
        held = shards_of(optimizer)  # its variables exist: it is built

        def save_own_variables(store: Any, held: list = held) -> None:
            for i, v in enumerate(held):
                whole = v.whole() if isinstance(v, ConsolidatedShard) else v
                store[str(i)] = np.asarray(whole.numpy())

        def load_own_variables(store: Any, held: list = held, name: str = optimizer.name) -> None:
            if len(store.keys()) != len(held):
                _skip_loading(name, len(held), len(store.keys()))
                return
            for i, v in enumerate(held):
                if isinstance(v, ConsolidatedShard):
                    v.assign_whole(store[str(i)])
                else:
                    v.assign(store[str(i)])

        optimizer.save_own_variables = save_own_variables
        optimizer.load_own_variables = load_own_variables
