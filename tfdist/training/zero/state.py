"""Optimizer state and gradients sharded over the replicas (ZeRO-1 and ZeRO-2).

``ExchangeOptions(sharding="optimizer")`` (ZeRO-1): each replica keeps the
optimizer state of only its ``1/N`` block of every trainable variable
(`tfdist.training.zero.layout`: flattened, zero-padded, cut in ``N`` rows). An
update then runs, in replica context:

1. the gradients are exchanged in the block layout, in buckets (the exchange's
   ``bucket_bytes``, else about `GATHER_BUCKET_BYTES`; 16-bit when so configured), the
   last layers' first, one bucket at a time: each replica keeps only the summed row of
   its blocks (a reduce-scatter, done on CPU as an all-reduce and a slice, the only form
   of it that ``tf.distribute`` offers), so no replica holds more than about two
   buckets of summed gradients at once;
2. the block of each variable is copied into its *master shard* (a per-replica
   variable of ``S`` elements: the optimizer's own variable), and the user's Keras
   optimizer updates the master shards only, with its slots (Adam's moments, momentum)
   sharded alike;
3. the updated blocks are all-gathered, one bucket at a time, and written into every
   replica's copy of the model's variables, each variable whole by one dense assign (never
   by slices: after a slice assign a TF variable copies itself on every later read).

``sharding="gradients"`` (ZeRO-2) differs under accumulation: it reduces every
micro-batch at once into a sum buffer of blocks, so no replica keeps a full gradient
beyond the micro-batch that makes it, at the cost of ``k`` exchanges per update
instead of one (``"optimizer"`` sums whole micro-batch gradients locally and
exchanges once per update).

A sparse gradient (``tf.IndexedSlices``, an ``Embedding`` lookup's) is not summed: every
replica's rows are all-gathered (`tfdist.training.step.exchange.gather_slices`, uncompressed,
outside
the buckets), and each replica keeps the elements of those rows that fall in its block, duplicate
rows apart (`tfdist.training.zero.layout.block_slices`), so its optimizer gets the
slices of its
master shard that Keras's ``fit`` would give it on one device (Adam squares each row before
duplicates are summed). Under ``"gradients"`` with accumulation such a gradient's rows are kept
until the update, as unsharded accumulation keeps them. Block layouts come from the variables'
shapes, never from a gradient's static shape (partly unknown for a ``Dense`` on 3-D input).

What needs a view of a whole tensor is made right: ``clipnorm`` and
``global_clipnorm`` from one small all-reduce of the blocks' squared norms, and a
loss-scale optimizer's finite check by one decision for all replicas. Optimizers
with per-tensor statistics (Adafactor, Lamb, Muon) and ``use_ema`` are refused
(`check_optimizer`). Backups stay consolidated: each sharded slot is saved as one
full tensor (`tfdist.training.zero.checkpoint`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any, Literal

import keras
import tensorflow as tf

from tfdist._compat.keras_internals.keras_training import variable_key, weight_decay_exclusions
from tfdist._compat.keras_internals.unit_calls import unit_layers
from tfdist.config import invalid_argument
from tfdist.training.zero.checkpoint import save_whole
from tfdist.training.zero.layout import shard_size

logger = logging.getLogger(__name__)

Sharding = Literal["optimizer", "gradients", "parameters"]
SHARDINGS = ("optimizer", "gradients", "parameters")
#: About how many bytes of blocks each all-gather of updated parameters (and, for
#: ``"gradients"``, each reduce-scatter) carries: few collectives, no full-size buffer.
GATHER_BUCKET_BYTES = 8 << 20
#: Built-in optimizers whose update of an element reads other elements of its tensor.
_WHOLE_TENSOR = {
    "Adafactor": "factors each matrix's second moment into row and column statistics",
    "Lamb": "scales each tensor's update by its trust ratio (norm of the weights over the update)",
    "Muon": "orthogonalises each weight matrix's update as a whole",
    "ScheduleFreeAdamW": "starts its momentum from a copy of the whole weights when built",
    "MultiOptimizer": "routes each variable to an optimizer of its own",
}


def inner_optimizer(optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    return getattr(optimizer, "inner_optimizer", optimizer)


def check_sharding(sharding: str | None, runner: Any) -> None:
    """Refuses sharding on a strategy without replicas to shard over (one_device, ps)."""
    if sharding is not None and runner.sharding_refusal:
        raise invalid_argument(
            "sharding", sharding, "None on this strategy", note=runner.sharding_refusal
        )


def check_optimizer(optimizer: keras.optimizers.Optimizer, sharding: str) -> None:
    """Refuses an optimizer whose update a block of each tensor cannot compute alone.

    Raises:
        ValueError: Naming ``sharding``, the optimizer and why; for ``use_ema`` and for an
            optimizer already built on the whole variables.
    """
    inner = inner_optimizer(optimizer)
    name = type(inner).__name__
    why = _WHOLE_TENSOR.get(name)
    if why is None and getattr(inner, "use_ema", False):
        name, why = f"{name}(use_ema=True)", "keeps a moving average of the whole weights"
    if why is not None:
        raise invalid_argument(
            "sharding",
            sharding,
            f"None with {name}",
            note=f"{name} {why}: a replica holding one block of each tensor cannot compute "
            "it. Use an element-wise optimizer (SGD, Adam, AdamW, RMSprop, ...) or no sharding.",
        )
    if inner.built:
        raise invalid_argument(
            "sharding",
            sharding,
            "an optimizer that is not built yet",
            note=f"This {name} already holds state for the whole variables (it was built, e.g. "
            "by a fit or a load); sharding builds it on each replica's block. Pass a new "
            "optimizer, or train without sharding.",
        )


def _per_replica(next_creator: Any, **kwargs: Any) -> Any:
    kwargs["synchronization"] = tf.VariableSynchronization.ON_READ
    kwargs["aggregation"] = tf.VariableAggregation.ONLY_FIRST_REPLICA
    return next_creator(**kwargs)


@contextlib.contextmanager
def slots_per_replica(optimizer: keras.optimizers.Optimizer, made: list) -> Iterator[None]:
    """While building: the optimizer's slots (made from a reference) are per-replica variables.

    Its other variables (``iterations``, a loss scale) stay mirrored. ``made`` gets
    ``(slot, reference)`` pairs.
    """
    original = optimizer.add_variable_from_reference

    def from_reference(reference_variable: Any, *args: Any, **kwargs: Any) -> Any:
        with tf.variable_creator_scope(_per_replica):
            slot = original(reference_variable, *args, **kwargs)
        made.append((slot, reference_variable))
        return slot

    optimizer.add_variable_from_reference = from_reference
    try:
        yield
    finally:
        del optimizer.add_variable_from_reference


def master_shard(variable: Any, strategy: tf.distribute.Strategy, colocate: bool) -> Any:
    """A per-replica variable of one block of ``variable`` (in ``strategy``'s scope)."""
    n = strategy.num_replicas_in_sync
    where = strategy.extended.colocate_vars_with(variable.value) if colocate else None
    with where or contextlib.nullcontext(), tf.variable_creator_scope(_per_replica):
        return keras.Variable(
            tf.zeros([shard_size(elements(variable.shape), n)], variable.dtype),
            dtype=variable.dtype,
            trainable=False,
            name=variable.name,
        )


class ShardedState:
    """The master shards of a model's trainable variables and the optimizer built on them.

    Args:
        model: The compiled model, its variables in the strategy's scope.
        strategy: A mirrored or MultiWorkerMirrored strategy.
        sharding: ``"optimizer"`` or ``"gradients"``.
        colocate: Make each master shard on its variable's devices (pipeline stages, whose
            variables each live on their stage's device) rather than the replicas'.

    Attributes:
        variables: The model's trainable variables, in order.
        masters: One per-replica variable of ``S`` elements per trainable variable.
        full_shapes: ``id`` of each sharded optimizer variable's TF variable -> the shape of
            the whole tensor (what a backup saves).
    """

    #: Variables kept whole (``id``s): none here (`tfdist.training.zero.parameters` may keep some).
    kept_ids: frozenset[int] = frozenset()
    #: The layers ``units=`` names: none here (`tfdist.training.zero.parameters` may name some).
    units: tuple = ()

    def __init__(
        self,
        model: keras.Model,
        strategy: tf.distribute.Strategy,
        sharding: str,
        *,
        colocate: bool = False,
    ):
        optimizer = model.optimizer
        check_optimizer(optimizer, sharding)
        self.sharding = sharding
        self.num_replicas = strategy.num_replicas_in_sync
        self.variables = list(model.trainable_variables)
        overwritten = [v.path for v in self.variables if getattr(v, "overwrite_with_gradient", 0)]
        if overwritten:
            raise invalid_argument(
                "sharding",
                sharding,
                "None for a model whose variables take their gradient as their new value",
                note=f"{overwritten} set overwrite_with_gradient (e.g. float8 scales): the "
                "optimizer skips them, and their blocks would not make them whole.",
            )
        self.masters, self.full_shapes = optimizer_on_shards(
            optimizer, self.variables, strategy, colocate=colocate
        )


def optimizer_on_shards(
    optimizer: keras.optimizers.Optimizer,
    variables: list,
    strategy: tf.distribute.Strategy,
    *,
    colocate: bool,
    keep: frozenset[int] = frozenset(),
    shards: list | None = None,
) -> tuple[list, dict[int, Any]]:
    """One `master_shard` per variable (ZeRO-1/2's master shards, ZeRO-3's blocks) and
    ``optimizer`` built on them: its slots are blocks too, excluded from weight decay as their
    variables are, saved whole. Returns the shards and ``full_shapes``: ``id`` of each sharded
    slot's TF variable -> the whole tensor's shape. Variables
    ``keep`` (indices) are their own shards: whole, their slots whole per replica. ``shards``:
    made already (ZeRO-3 fills each and empties its variable before the slots exist)."""
    made: list[tuple[Any, Any]] = []
    with strategy.scope():
        shards = shards or [
            v if i in keep else master_shard(v, strategy, colocate) for i, v in enumerate(variables)
        ]
        with slots_per_replica(inner_optimizer(optimizer), made):
            optimizer.build(shards)
    index = {id(s): i for i, s in enumerate(shards)}
    full_shapes = {
        id(slot.value): variables[index[id(ref)]].shape
        for slot, ref in made
        if index[id(ref)] not in keep
    }
    _exclude_alike(inner_optimizer(optimizer), variables, shards)
    optimizers = {id(o): o for o in (optimizer, inner_optimizer(optimizer))}
    save_whole(list(optimizers.values()), full_shapes, strategy)
    return shards, full_shapes


def _exclude_alike(optimizer: keras.optimizers.Optimizer, variables: list, masters: list) -> None:
    """Variables excluded from weight decay by object have their master shards (or their
    blocks, ``sharding="parameters"``) excluded too.

    Exclusions by name match already: a master shard or block has its variable's name.
    """
    excluded = weight_decay_exclusions(optimizer)
    if excluded:
        for v, m in zip(variables, masters):
            if variable_key(optimizer, v) in excluded:
                excluded.add(variable_key(optimizer, m))


def replica_bytes(
    model: keras.Model,
    *,
    num_replicas: int,
    sharding: str | None,
    accumulation_steps: int,
    full_shapes: dict[int, Any] | None = None,
    kept: frozenset[int] = frozenset(),
    units: list | None = None,
) -> dict[str, Any]:
    """Bytes each replica holds, by kind, from the variables' shapes, and the same unsharded.

    ``parameters``: the model's variables (whole on every replica; under ``"parameters"`` the
    trainable ones' blocks); ``optimizer_state``: the optimizer's variables (blocks when
    sharded); ``gradients``: the gradient buffers an update keeps (whole, or blocks under
    ``"gradients"`` and ``"parameters"``; twice with accumulation: the sum and one
    micro-batch's); ``master_shards``: the blocks the optimizer updates (under ``"parameters"``
    the blocks are the parameters: none); ``gathered_unit``: the largest unit's (layer's)
    trainable variables whole, which ``"parameters"`` gathers while that layer runs (else 0);
    with ``units`` (``ExchangeOptions.units``), the largest named layer's plus the model's
    weights outside every named layer, which stay gathered for the whole step beside it
    (`tfdist.training.zero.named_units`).
    """
    full_shapes = full_shapes or {}
    trainable = model.trainable_variables
    whole = sum(_bytes(v) for v in trainable)
    cut = sum(  # ``kept``: ``id``s of variables kept whole (``"parameters"``)
        _bytes(v)
        if id(v) in kept
        else shard_size(elements(v.shape), num_replicas) * tf.as_dtype(v.dtype).size
        for v in trainable
    )
    state = unsharded_state = 0
    for v in model.optimizer.variables:
        tf_variable = v.value if isinstance(v, keras.Variable) else v
        size = tf.as_dtype(v.dtype).size
        state += elements(v.shape) * size
        unsharded_state += elements(full_shapes.get(id(tf_variable), v.shape)) * size
    buffers = 2 if accumulation_steps > 1 else 1
    params = sum(_bytes(v) for v in model.variables)
    blocks_only = sharding == "parameters"
    # Nested functional models: their layers, as they run; or the layers ``units=`` names.
    layers = units or unit_layers(model)
    unit = max(
        (sum(_bytes(v) for v in la.trainable_variables if id(v) not in kept) for la in layers),
        default=0,
    )
    if units:  # the weights outside every named unit stay gathered for the whole step
        named = {id(v) for la in units for v in la.trainable_variables}
        unit += sum(_bytes(v) for v in trainable if id(v) not in named and id(v) not in kept)
    return {
        "parameters": params - whole + cut if blocks_only else params,
        "optimizer_state": state,
        "gradients": buffers * (cut if sharding in ("gradients", "parameters") else whole),
        "master_shards": cut if sharding in ("optimizer", "gradients") else 0,
        "gathered_unit": unit if blocks_only else 0,
        "unsharded": {
            "parameters": params,
            "optimizer_state": unsharded_state,
            "gradients": buffers * whole,
            "master_shards": 0,
            "gathered_unit": 0,
        },
    }


def elements(shape: Any) -> int:
    return tf.TensorShape(shape).num_elements()


def _bytes(variable: Any) -> int:
    return elements(variable.shape) * tf.as_dtype(variable.dtype).size


def log_replica_bytes(held: dict[str, Any], sharding: str, runner: Any) -> None:
    """Logs once (chief) what each replica holds, sharded and unsharded."""
    if not runner.is_chief:
        return
    unsharded = held["unsharded"]

    def mb(value: int) -> str:
        return f"{value / 2**20:.1f} MB" if value >= 2**20 else f"{value / 2**10:.1f} kB"

    logger.info(
        "Sharding %r over %d replicas: each replica holds parameters %s (unsharded %s), "
        "optimizer state %s "
        "(unsharded %s), gradient buffers %s (unsharded %s), master shards %s and a largest "
        "gathered unit of %s.",
        sharding,
        runner.strategy.num_replicas_in_sync,
        mb(held["parameters"]),
        mb(unsharded["parameters"]),
        mb(held["optimizer_state"]),
        mb(unsharded["optimizer_state"]),
        mb(held["gradients"]),
        mb(unsharded["gradients"]),
        mb(held["master_shards"]),
        mb(held["gathered_unit"]),
    )


def log_one_replica(sharding: str, runner: Any) -> None:
    """Logs (chief) that sharding over one replica trains unsharded: a block is the whole
    variable, and its master shard would be one more copy of the parameters."""
    if runner.is_chief:
        logger.info(
            "Sharding %r over 1 replica would hold more, not less (each block is a whole "
            "variable, plus a master copy): training unsharded. Backups are the same format, "
            "so a sharded run's backup resumes here and this one's resumes sharded.",
            sharding,
        )
