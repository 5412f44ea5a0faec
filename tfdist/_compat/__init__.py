"""Shims for Keras/TF behaviour that tfdist works around, and TF/Keras internals, in one place.

Each shim is gated on a **probe of the behaviour it fixes** (not on a version
number: Keras master still has the same code), is applied only where its probe
finds that behaviour, and has a test in ``tests/test_compat.py`` that fails when
upstream changes. The probes call the upstream function with small stand-ins
(a fake strategy or distribution that records what it is asked to do), so they
are cheap, need no cluster and create no tensors: ``apply`` runs at import,
before a multi-worker program creates its strategy, and TF refuses to configure
collectives once its context is initialised.

Modules, by job:
  * ``shims``: the ``Shim`` record (name, reason, probe, patches) and the
    table-driven `apply_table`; `original` gives back what a shim replaced.
  * ``probing``: the recording stand-ins the probes use.
  * ``keras_internals/``: Keras's private names (the training internals, callbacks and the
    progress bar, masks, metric state, the optimizer's all-reduce, atomic increments, scope
    moves, a functional model's graph, ``PyDataset``'s reader, plain ``model.fit`` on
    MultiWorkerMirrored workers). Its ``__init__`` maps each module.
  * ``tf_internals/``: TensorFlow's private names (the runtime's state, the cluster
    coordinator, the asynchronous checkpoint writer, one-replica iterators,
    ``ShardedVariable``, sharded optimizer state saved whole, profiler traces, the bench's
    reads). Its ``__init__`` maps each module.

Set ``TFDIST_DISABLE_COMPAT=symbolic_build`` (comma separated) to skip a shim,
e.g. to check whether upstream still needs it.
"""

from __future__ import annotations

from tfdist._compat.keras_internals.atomic import (
    VARIABLE,
    keras_assign_add_is_read_then_write,
    make_atomic,
)
from tfdist._compat.keras_internals.metric_state import (
    additive,
    metric_state_as_tensors,
    metric_variables,
)
from tfdist._compat.keras_internals.multi_worker_fit import (
    TRAINER_MODULE,
    keras_reduces_batch_to_build,
    keras_reduces_scalars_on_axis_0,
    local_batch,
    make_reduce_per_replica,
    maybe_symbolic_build,
)
from tfdist._compat.keras_internals.optimizer import gradients_already_summed
from tfdist._compat.keras_internals.thread_losses import (
    LAYER,
    keras_layer_losses_are_shared,
    make_add_loss,
    make_clear_losses,
    make_get_own_losses,
)
from tfdist._compat.shims import Patch, Shim, apply_table, disabled, in_force, original
from tfdist._compat.tf_internals.inputs import one_cpu_replica, plain_iterator
from tfdist._compat.tf_internals.partitioned import (
    KERAS_VARIABLE,
    TF_OPTIMIZER,
    is_sharded_variable,
    keras_slots_colocate_with_reference,
    keras_updates_sharded_through_extended_update,
    keras_weight_decay_uses_extended_update,
    make_array,
    make_sharded_gradient,
    make_sharded_slot,
    make_sharded_update,
    make_sharded_weight_decay,
    sharded_variable_lacks_array,
    sharded_variables_lack_handle,
    shards_of,
)
from tfdist._compat.tf_internals.runtime import (
    connected_cluster,
    connected_to_cluster,
    coordination_service_enabled,
    key_value_get,
    key_value_insert,
    key_value_set,
    op_determinism_enabled,
    tf_runtime_started,
)

#: What `apply` considers, in order (``import tfdist`` applies them once Keras loads).
SHIM_TABLE: tuple[Shim, ...] = (
    Shim(
        "symbolic_build",
        "Keras fit reduces the first distributed batch across workers only to learn its shapes",
        keras_reduces_batch_to_build,
        (
            Patch(
                TRAINER_MODULE + ":TensorFlowTrainer",
                "_maybe_symbolic_build",
                lambda upstream: maybe_symbolic_build,
            ),
        ),
    ),
    Shim(
        "multi_worker_reduce",
        "Keras reduces scalar metrics with axis=0 under multi-worker collectives",
        keras_reduces_scalars_on_axis_0,
        (Patch(TRAINER_MODULE, "reduce_per_replica", make_reduce_per_replica),),
    ),
    Shim(
        "atomic_assign_add",
        "Keras assign_add is a read then a write: concurrent PS workers lose increments",
        keras_assign_add_is_read_then_write,
        (
            Patch(VARIABLE, "assign_add", lambda upstream: make_atomic(upstream, "assign_add")),
            Patch(VARIABLE, "assign_sub", lambda upstream: make_atomic(upstream, "assign_sub")),
        ),
    ),
    Shim(
        "sharded_variables",
        "Keras updates a ShardedVariable through extended.update and reads it through __array__",
        lambda: keras_updates_sharded_through_extended_update() or sharded_variable_lacks_array(),
        (
            Patch(TF_OPTIMIZER, "_distributed_tf_update_step", make_sharded_update),
            Patch(KERAS_VARIABLE, "__array__", make_array),
        ),
    ),
    Shim(
        "thread_losses",
        "Keras keeps add_loss terms in one list per layer, shared by MirroredStrategy's threads",
        keras_layer_losses_are_shared,
        (
            Patch(LAYER, "add_loss", make_add_loss),
            Patch(LAYER, "_get_own_losses", make_get_own_losses),
            Patch(LAYER, "_clear_losses", make_clear_losses),
        ),
    ),
)

#: What `apply_sharded_variable_shims` considers (``make_strategy("parameter_server")``).
SHARDED_VARIABLE_SHIM_TABLE: tuple[Shim, ...] = (
    Shim(
        "sharded_gradients",
        "GradientTape cannot take a Keras variable that wraps a ShardedVariable",
        sharded_variables_lack_handle,
        (Patch("tensorflow:GradientTape", "gradient", make_sharded_gradient),),
    ),
    Shim(
        "sharded_weight_decay",
        "Keras applies weight decay through extended.update, which a ShardedVariable refuses",
        keras_weight_decay_uses_extended_update,
        (Patch(TF_OPTIMIZER, "_apply_weight_decay", make_sharded_weight_decay),),
    ),
    Shim(
        "sharded_slots",
        "Keras creates slots under colocate_vars_with, which a ShardedVariable refuses in a graph",
        keras_slots_colocate_with_reference,
        (Patch(TF_OPTIMIZER, "add_variable_from_reference", make_sharded_slot),),
    ),
)

#: Names of the shims `apply` considers, in order.
SHIMS = tuple(shim.name for shim in SHIM_TABLE)
#: Names of the shims `apply_sharded_variable_shims` considers, in order.
SHARDED_VARIABLE_SHIMS = tuple(shim.name for shim in SHARDED_VARIABLE_SHIM_TABLE)
_BY_NAME = {shim.name: shim for shim in SHIM_TABLE + SHARDED_VARIABLE_SHIM_TABLE}


def shim(name: str) -> Shim:
    """The ``Shim`` record called ``name``."""
    return _BY_NAME[name]


def needs(name: str) -> bool:
    """Whether upstream still shows the behaviour that shim ``name`` works around."""
    return _BY_NAME[name].probe()


def apply() -> list[str]:
    """Applies each shim of `SHIM_TABLE` whose probe finds the behaviour it fixes. Idempotent.

    Returns:
        The names of the shims in force.
    """
    return apply_table(SHIM_TABLE)


def apply_sharded_variable_shims() -> list[str]:
    """Applies the shims of `SHARDED_VARIABLE_SHIM_TABLE` where needed. Idempotent.

    ``make_strategy("parameter_server")`` calls it (with `apply`), so
    partitioned variables work in users' own training loops as well as in the
    Trainer.

    Returns:
        The names of these shims in force.
    """
    return apply_table(SHARDED_VARIABLE_SHIM_TABLE)


__all__ = [
    "SHARDED_VARIABLE_SHIMS",
    "SHARDED_VARIABLE_SHIM_TABLE",
    "SHIMS",
    "SHIM_TABLE",
    "Patch",
    "Shim",
    "additive",
    "apply",
    "apply_sharded_variable_shims",
    "connected_cluster",
    "connected_to_cluster",
    "coordination_service_enabled",
    "key_value_get",
    "key_value_insert",
    "key_value_set",
    "op_determinism_enabled",
    "plain_iterator",
    "disabled",
    "gradients_already_summed",
    "in_force",
    "is_sharded_variable",
    "keras_assign_add_is_read_then_write",
    "keras_layer_losses_are_shared",
    "keras_reduces_batch_to_build",
    "keras_reduces_scalars_on_axis_0",
    "keras_slots_colocate_with_reference",
    "keras_updates_sharded_through_extended_update",
    "keras_weight_decay_uses_extended_update",
    "local_batch",
    "make_array",
    "make_atomic",
    "make_reduce_per_replica",
    "make_sharded_gradient",
    "make_sharded_slot",
    "make_sharded_update",
    "make_sharded_weight_decay",
    "maybe_symbolic_build",
    "metric_state_as_tensors",
    "metric_variables",
    "needs",
    "one_cpu_replica",
    "original",
    "shards_of",
    "shim",
    "sharded_variable_lacks_array",
    "sharded_variables_lack_handle",
    "tf_runtime_started",
]
