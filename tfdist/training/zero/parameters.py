"""Parameters sharded too (ZeRO-3, ``sharding="parameters"``): each trainable variable lives
only as one ``[S]`` block per replica, and each top-level layer gathers its weights just before
it runs (`tfdist.training.zero.units`). The Trainer's update on them is
`tfdist.training.zero.parameters_update.ParametersUpdate`.

Storage: the blocks are per-replica Keras variables (``ON_READ``, ``ONLY_FIRST_REPLICA``, as
the master shards of ``"optimizer"`` and ``"gradients"``), on which the Keras optimizer is
built (its slots are blocks too, saved whole by `tfdist.training.zero.checkpoint`). Each block
is cut from the built model's variable, one variable at a time; the model's trainable Keras
variables then lose their TF variables and keep their shapes, dtypes and regularizers: a read
of one outside its layer's gather raises (`unmapped_read`), where Keras would silently hand
back the initializer's value. Non-trainable variables (moving statistics, seed states) stay
whole and mirrored, and so do trainable ones of fewer than ``keep_whole_below`` elements
(``ExchangeOptions(keep_whole_below=...)``, off by default: biases, norms), which are never
gathered; their gradients are summed with the update's example count, as unsharded training
sums them (on a small GPT: 89 collectives a step instead of 218, about 1.5x the examples/s on
a busy 2-core host).

**Between fits the model is whole; during a fit only blocks exist**, and never both: each
trainable variable keeps two TF variables for the Trainer's life, its own (whole) and its block
(`tfdist._compat.keras_internals.storage`), and only one holds values at a time, the other an
empty ``[0]`` buffer. At a fit's start `ParameterState.cut` fills each variable's block from it
and empties the whole one, variable after variable (the first cut, when the blocks are made,
before the optimizer's slots exist); at its end `ParameterState.restore` gathers each variable
whole into its own storage and empties its block, variable after variable, on every worker
alike, so that ``model.evaluate``, ``predict``, ``get_weights``, ``save`` and
``keras.saving.load_model`` are plain Keras on an ordinary model, and a worker holds about one
model's bytes through the boundary (the whole variables filling as the blocks empty) beside the
optimizer's slots, which stay blocks: the next fit and its backups need them. The same TF
variables every fit keep what was traced on the blocks (the compiled step, the optimizer's
slot keys) valid. A read of a model's variable during a fit raises (`unmapped_read`), and so
does a read of a block between fits (`emptied_block`). On the memory bench's GPT (2 workers)
the whole run's allocator peak is then the steps' own, 0.45x unsharded; it was the fit's
boundaries, 0.547x, when the blocks stayed filled between fits and the restore made the whole
model beside them (docs/benchmarks.md, "Memory").
The Keras callbacks known to read or write the weights during a fit (``ModelCheckpoint``,
``EarlyStopping(restore_best_weights=True)``, ``SwapEMAWeights``, ``TensorBoard`` with weight
histograms or embeddings) are refused at the fit's start
(`tfdist.training.fit.arguments.check_weight_callbacks`); any other that reads them (a user's
``model.get_weights()``) gets `unmapped_read`'s error; a fit that ends with an error leaves the
blocks, from which the next fit continues.

Backups (``backup_dir=``, ``BackupAndRestore``, a SIGTERM's save) hold the weights and the
optimizer slots whole, in an unsharded run's format (`ParameterState.in_checkpoint`): a
``"parameters"`` backup resumes sharded or not, on any replica count, and an unsharded or
ZeRO-1/2 backup resumes sharded.

Any model the Trainer builds: functional and Sequential models run one layer (unit) at a time,
nested ones layer by layer, and Keras masks travel between the units as Keras passes them
(`tfdist.training.zero.units`). A subclassed model (its own ``call``, no functional graph) runs
as **one unit**: every weight is gathered before its call and released after it, and again for
its backward, so while it runs a replica holds the whole model's weights (and in the backward
their whole gradients), ``replica_bytes["gathered_unit"]`` all of them; what stays 1/N is what
lives between steps (weights, accumulated gradients, optimizer state). Built as layers of a
functional model, its parts would be gathered one at a time; or ``units=`` names its blocks
(``ExchangeOptions(units=...)``, `tfdist.training.zero.named_units`): each gathered one call at
a time wherever it runs, the rest of the weights once per step.

Refused, each by name: an optimizer a block cannot update
(`tfdist.training.zero.state.check_optimizer`), a pipeline and uneven shares (``balance=``,
untested) (`check_trainer`); a loss with masked terms under accumulation
(`tfdist.training.zero.parameters_update`).
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tfdist._compat.keras_internals.optimizer import gradients_already_summed
from tfdist._compat.keras_internals.storage import attach, detach, emptied, resize, storage_of
from tfdist.config import invalid_argument
from tfdist.training.zero.checkpoint import local_replica_ids
from tfdist.training.zero.layout import block
from tfdist.training.zero.named_units import find_units
from tfdist.training.zero.state import (
    check_optimizer,
    elements,
    inner_optimizer,
    master_shard,
    optimizer_on_shards,
)
from tfdist.training.zero.units import Units, gather_whole


class ReadGuard:
    """The initializer of a storage-less variable: any read raises ``RuntimeError(message)``
    (Keras calls it where it would otherwise hand back the initializer's value)."""

    def __init__(self, message: str) -> None:
        self.message = message

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(self.message)


def unmapped_read(path: str) -> ReadGuard:
    """The guard of a model's variable during a fit: a read outside its layer's gather raises."""
    return ReadGuard(
        f"sharding='parameters': variable {path!r} was read outside its layer's "
        "gather. Its weights live as blocks on the replicas; only the layer that tracks it "
        "may read it, while it runs (a weight read by another layer's call, a Lambda "
        "closure, model.get_weights() or a save during training cannot be served)."
    )


def emptied_block(path: str) -> ReadGuard:
    """The guard of a block between fits, where it holds nothing: a read raises."""
    return ReadGuard(
        f"sharding='parameters': the block of variable {path!r} was read between "
        "fits, where it is empty: the model's variable holds the weights whole until the "
        "next fit cuts them into blocks again. Read the model's weights instead "
        "(model.get_weights(), the variable itself)."
    )


def check_model(model: keras.Model) -> None:
    """Refuses a model not built yet: its variables are cut into blocks once they exist (the
    Trainer builds the model from the first batch's spec, then cuts).

    Raises:
        ValueError: Naming ``sharding``, what was received and what is expected.
    """
    if not model.built:
        raise invalid_argument(
            "sharding",
            "parameters",
            "None for a model not built yet",
            note=f"{type(model).__name__} {model.name!r} has no variables yet to cut into "
            "blocks: build it first (call it on a batch, or model.build(input_shape)).",
        )


def check_trainer(*, pipeline: Any, balance: Any = None) -> None:
    """The Trainer's refusals of ``sharding="parameters"`` (over more than one replica): every
    model is served (a subclassed one as one unit), not every option beside it.

    Raises:
        ValueError: Naming the argument, what was received and what is expected.
    """
    if pipeline is not None:
        raise invalid_argument(
            "sharding",
            "parameters",
            "None, 'optimizer' or 'gradients' with pipeline=",
            note="A pipeline places each stage's variables on its own device; sharded "
            "parameters keep each variable as blocks on the replicas instead.",
        )
    if balance is not None:
        raise invalid_argument(
            "balance",
            balance,
            "False with sharding='parameters'",
            note="Uneven shares of the global batch on sharded parameters are not tested yet: "
            "balance with sharding='gradients', or shard the parameters with even shares.",
        )


class ParameterState:
    """The blocks of ``model``'s trainable variables and its optimizer built on them.

    Args:
        model: A built model with an optimizer (``model.optimizer``), made in ``strategy``'s
            scope.
        strategy: A MirroredStrategy or MultiWorkerMirroredStrategy.
        keep_whole_below: Trainable variables of fewer elements stay whole and mirrored,
            never cut nor gathered (``ExchangeOptions.keep_whole_below``; DeepSpeed's
            ``param_persistence_threshold``); their gradients are all-reduced with the
            update's example count, as unsharded training sums them. None or 0: none.
        units: Layer classes and names (``ExchangeOptions.units``): the layers, anywhere in the
            model, that run one call at a time (`tfdist.training.zero.named_units`), every
            other weight gathered once per step; None: each top-level layer (nested functional
            models layer by layer; a subclassed model whole).

    Attributes:
        variables: The model's trainable variables (no storage once this returns).
        blocks: One per-replica variable of ``S`` elements per trainable variable.
        storage: Each trainable variable's TF variable, kept for the Trainer's life: it holds
            the weights between fits and an empty buffer during them (`blocks` the reverse).
    """

    sharding = "parameters"

    def __init__(
        self,
        model: keras.Model,
        strategy: tf.distribute.Strategy,
        *,
        keep_whole_below: int | None = None,
        units: tuple | None = None,
    ) -> None:
        check_model(model)
        #: The layers ``units=`` names (none: `tfdist.training.zero.units`'s default units).
        self.units = find_units(model, units) if units else []
        optimizer = model.optimizer
        check_optimizer(optimizer, "parameters")
        self.model, self.strategy = model, strategy
        self.num_replicas = strategy.num_replicas_in_sync
        self.replica_ids = local_replica_ids(strategy)
        self.variables = list(model.trainable_variables)
        #: Indices (and ``id``s) of the variables kept whole and mirrored (``keep_whole_below``):
        #: their "block" is the model's variable itself.
        self.kept = frozenset(
            i for i, v in enumerate(self.variables) if elements(v.shape) < (keep_whole_below or 0)
        )
        self.kept_ids = frozenset(id(self.variables[i]) for i in self.kept)
        self.storage = [storage_of(v) for v in self.variables]
        self._gathers: dict[tuple, Any] = {}  # a restore's gather per (shape, dtype), traced once
        #: ``full_shapes``: ``id`` of each sharded slot's TF variable -> the whole tensor's shape.
        self.blocks, self.full_shapes = optimizer_on_shards(
            optimizer,
            self.variables,
            strategy,
            colocate=False,
            keep=self.kept,
            shards=self._first_blocks(),  # before the slots: never the whole model beside them
        )
        self.block_storage = [storage_of(b) for b in self.blocks]
        #: ``id`` of each block's TF variable -> its variable's whole shape (`in_checkpoint`).
        self.block_shapes = {
            id(self.block_storage[i]): self.variables[i].shape for i in self.cut_indices
        }
        self.generation = 0  # counts cuts and restores: what compiled the storage of before
        #: The optimizer's ``clipnorm`` and ``global_clipnorm``: during a fit they clip the
        #: whole tensors' norms (`tfdist.training.zero.parameters_update`), not the blocks'.
        self.clipping: tuple[Any, Any] = (None, None)
        self._cut_done()

    @property
    def cut_indices(self) -> list[int]:
        """The indices of the variables cut into blocks (all but the `kept` ones)."""
        return [i for i in range(len(self.variables)) if i not in self.kept]

    @property
    def whole(self) -> bool:
        """Whether the model's trainable variables hold their values (between fits)."""
        return all(storage_of(v) is not None for v in self.variables)

    def in_checkpoint(self, variables: list) -> list:
        """``variables`` (Keras variables of the model, in its order) with each trainable one's
        block in its place. A backup tracks these with `block_shapes`: each block is saved whole
        (its replicas' blocks gathered) under the key the whole variable
        has in an unsharded run's backup, and restored by giving each replica its block for the
        replica count of the run that reads it (`tfdist.training.zero.checkpoint`). A backup is
        made and written during a fit, where the blocks hold the weights (the same TF variables
        every fit: a backup made then serves every later fit); between fits they are empty and
        a read of one raises (`emptied_block`)."""
        blocks = {id(v): b for v, b in zip(self.variables, self.blocks)}
        return [blocks.get(id(v), v) for v in variables]

    def _first_blocks(self) -> list:
        """Each variable's block made and filled, and its whole storage emptied, one variable
        after the other (in the strategy's scope, before the optimizer's slots are made)."""
        made = []
        with self.strategy.scope():
            for i, variable in enumerate(self.variables):
                if i in self.kept:
                    made.append(variable)
                    continue
                made.append(master_shard(variable, self.strategy, colocate=False))
                self._move_in(i, storage_of(made[-1]))
        return made

    def _move_in(self, i: int, target: Any) -> None:
        """Variable ``i``'s values into ``target`` (its block's TF variable: each local replica
        its own block, of any size before), then its whole storage emptied."""
        whole = self.storage[i]
        pieces = []
        for component, replica in zip(whole.values, self.replica_ids):
            with tf.device(component.device):
                pieces.append(block(component.read_value(), self.num_replicas, replica))
        resize(target, pieces)
        del pieces
        emptied(whole)

    def cut(self) -> None:
        """Every trainable variable into its blocks, its whole storage emptied, one after the
        other (a fit's start): about one model's bytes held throughout, never two."""
        if not self.variables or not self.whole:
            return
        for i in self.cut_indices:
            attach(self.blocks[i], self.block_storage[i])
            self._move_in(i, self.block_storage[i])
        self._cut_done()

    def _cut_done(self) -> None:
        """After a cut: the model's trainable variables read-guarded, Keras's compiled functions
        dropped (made again when next asked), norm clipping taken over."""
        for variable in (self.variables[i] for i in self.cut_indices):
            detach(variable, unmapped_read(variable.path))
        model = self.model
        model.train_function = model.test_function = model.predict_function = None
        inner = inner_optimizer(model.optimizer)
        self.clipping = inner.clipnorm, inner.global_clipnorm
        inner.clipnorm = inner.global_clipnorm = None
        self.generation += 1

    def restore(self) -> None:
        """Every trainable variable whole again in its own storage, and its block emptied, one
        after the other (a fit's end; call it on every worker alike: the blocks are
        all-gathered)."""
        if not self.variables or self.whole:
            return
        for i in self.cut_indices:
            variable, blocks = self.variables[i], self.block_storage[i]
            wholes = self._gather(variable.shape, blocks.dtype)(self._per_replica(blocks))
            resize(self.storage[i], self.strategy.experimental_local_results(wholes))
            del wholes
            attach(variable, self.storage[i])
            emptied(blocks)
            detach(self.blocks[i], emptied_block(variable.path))
        inner = inner_optimizer(self.model.optimizer)
        inner.clipnorm, inner.global_clipnorm = self.clipping
        self.generation += 1

    def _per_replica(self, tf_variable: Any) -> Any:
        """``tf_variable``'s local components, read now, as one per-replica value."""
        components, ids = tf_variable.values, self.replica_ids
        return self.strategy.experimental_distribute_values_from_function(
            lambda ctx: components[ids.index(ctx.replica_id_in_sync_group)].read_value()
        )

    def _gather(self, shape: Any, dtype: Any) -> Any:
        """A function from per-replica blocks to each replica's whole tensor of ``shape``, one
        per shape and dtype (a variable captured would trace one function per variable)."""
        key = (tuple(shape), tf.as_dtype(dtype).name)
        if key not in self._gathers:
            run = self.strategy.run
            self._gathers[key] = tf.function(
                lambda x: run(lambda b: gather_whole(b, shape), args=(x,)), autograph=False
            )
        return self._gathers[key]

    def whole_weights(self) -> list[np.ndarray]:
        """Every trainable variable whole: the model's between fits, else gathered from the
        blocks (call on every worker alike)."""
        if self.whole:
            return [np.asarray(v.numpy()) for v in self.variables]

        def gather() -> list[tf.Tensor]:
            return [
                tf.convert_to_tensor(b.value) if i in self.kept else gather_whole(b.value, v.shape)
                for i, (v, b) in enumerate(zip(self.variables, self.blocks))
            ]

        got = tf.function(lambda: self.strategy.run(gather), autograph=False)()
        return [self.strategy.experimental_local_results(t)[0].numpy() for t in got]


class ParameterStep:
    """One update on sharded parameters, in replica context: the forward unit by unit, the
    loss over the global batch (plus the units' regularizers and ``add_loss`` terms, once per
    update), the blocks' gradients (reduce-scattered in the backward), the optimizer on the
    blocks, the non-trainable updates, and constraints applied to the whole tensors.

    Args:
        state: The blocks and the optimizer.
        loss: A per-example loss, ``loss(y, y_pred)`` of shape ``[batch]``.
        global_batch_size: Examples per update over all replicas.
    """

    def __init__(self, state: ParameterState, loss: Any, *, global_batch_size: int) -> None:
        self.state, self.loss, self.global_batch_size = state, loss, global_batch_size
        self.units = Units(state.model, state.num_replicas, kept=state.kept_ids, named=state.units)

    def __call__(self, x: Any, y: Any) -> tf.Tensor:
        state, n = self.state, self.state.num_replicas
        blocks = [tf.convert_to_tensor(b.value) for b in state.blocks]
        with tf.GradientTape() as tape:
            tape.watch(blocks)
            y_pred = self.units.forward(x, blocks, training=True)
            loss = tf.reduce_sum(self.loss(y, y_pred)) / self.global_batch_size
            terms = self.units.loss_terms()
            if terms:  # as Keras adds model.losses once per batch: 1/N on each replica
                loss += tf.add_n(terms) / n
        grads = tape.gradient(loss, blocks)
        ctx = tf.distribute.get_replica_context()
        for i in state.kept:  # whole: summed over the replicas, as unsharded
            grads[i] = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads[i])
        self.units.write_updates()
        optimizer = state.model.optimizer
        with gradients_already_summed(optimizer, num_replicas=n):
            optimizer.apply(grads, state.blocks)
        constrain(state)
        return loss


def constrain(state: ParameterState) -> None:
    """Keras applies a constraint to the whole tensor after each update: the block is gathered,
    constrained whole and cut again, one variable at a time (replica context)."""
    done: list[Any] = []
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    for i, (variable, target) in enumerate(zip(state.variables, state.blocks)):
        if variable.constraint is None or i in state.kept:  # kept: by the optimizer
            continue
        with tf.control_dependencies(done):
            mine = tf.identity(target.value)
        whole = variable.constraint(gather_whole(mine, variable.shape))
        done = [target.assign(block(whole, state.num_replicas, replica))]
