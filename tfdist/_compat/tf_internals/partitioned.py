"""Shims for TF's ``ShardedVariable`` (ParameterServerStrategy with a variable partitioner).

Keras 3 does not know ``ShardedVariable``:

``sharded_variables``: Keras's TF optimizer applies each update through
``distribution.extended.update(var, ...)``, which colocates with the variable
and fails ("ShardedVariable doesn't support being used as a reference"), and
``Variable.__array__`` (used by ``get_weights`` and saving) calls the missing
``ShardedVariable.__array__``. The shim applies sharded updates directly (their
ops split across the shards) and reads sharded values through tensor conversion.

``sharded_gradients``: ``tf.GradientTape.gradient`` with a Keras variable that
wraps a ``ShardedVariable`` among its sources (a user's own loop under
``min_shard_bytes``) fails with "'ShardedVariable' object has no attribute
'handle'": the tape asks every variable for its one resource handle. The shim
takes the gradient of each shard and concatenates them along axis 0, as
tfdist's own step does, so ``apply_gradients`` gets one gradient per Keras variable.

``sharded_weight_decay``: Keras's ``_apply_weight_decay`` (AdamW, Lion, any
``weight_decay=``) updates each variable through ``distribution.extended.update``,
which fails like the optimizer step did. The shim decays sharded variables
directly (the update is split across the shards).

``sharded_slots``: an optimizer built inside a ``tf.function`` (a user loop's
first ``apply_gradients``) creates its slots under ``colocate_vars_with(var)``,
which fails in a graph for a ShardedVariable. The shim creates such slots
without colocation; the strategy's partitioner then shards them like the variable.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import tensorflow as tf

from tfdist._compat.probing import RecordingStrategy
from tfdist._compat.shims import original

TF_OPTIMIZER = "keras.src.backend.tensorflow.optimizer:TFOptimizer"
KERAS_VARIABLE = "keras.src.backend.tensorflow.core:Variable"


def is_sharded_variable(variable: Any) -> bool:
    """Whether ``variable`` is a TF ``ShardedVariable`` (not a Keras variable wrapping one).

    TF exports no public ``ShardedVariable`` class to ``isinstance`` against, so
    this matches the type's name; that also lets the probes use a stand-in.
    """
    return type(variable).__name__ == "ShardedVariable"


def shards_of(variable: Any) -> list[Any] | None:
    """The shards behind ``variable`` (a Keras variable or a ShardedVariable), else None."""
    # A Keras variable keeps its TF variable in the private `_value`.
    inner = getattr(variable, "_value", variable)
    return list(inner.variables) if is_sharded_variable(inner) else None


def make_sharded_update(upstream):
    """``TFOptimizer._distributed_tf_update_step`` that updates sharded variables directly."""

    def _distributed_tf_update_step(self, distribution, grads_and_vars, learning_rate):
        grads_and_vars = list(grads_and_vars)
        plain = [(g, v) for g, v in grads_and_vars if not is_sharded_variable(v)]
        if plain:
            upstream(self, distribution, plain, learning_rate)
        for grad, var in grads_and_vars:
            if is_sharded_variable(var):
                self.update_step(grad, var, learning_rate)

    return _distributed_tf_update_step


def make_array(upstream):
    """Keras ``Variable.__array__`` that reads a sharded value through tensor conversion."""

    def __array__(self, dtype=None, copy=None):
        if is_sharded_variable(getattr(self, "_value", None)):
            return np.asarray(tf.convert_to_tensor(self._value).numpy(), dtype=dtype)
        return upstream(self, dtype) if dtype is not None else upstream(self)

    return __array__


def make_sharded_gradient(upstream):
    """``tf.GradientTape.gradient`` taking each shard's gradient, concatenated per variable."""

    def gradient(self, target, sources, *args, **kwargs):
        flat = tf.nest.flatten(sources)
        shards = [shards_of(s) for s in flat]
        if all(s is None for s in shards):
            return upstream(self, target, sources, *args, **kwargs)
        expanded = [
            v for s, parts in zip(flat, shards) for v in (parts if parts is not None else [s])
        ]
        grads = upstream(self, target, expanded, *args, **kwargs)
        out, i = [], 0
        for parts in shards:
            if parts is None:
                out.append(grads[i])
                i += 1
                continue
            pieces, i = grads[i : i + len(parts)], i + len(parts)
            out.append(
                None
                if any(p is None for p in pieces)
                else tf.concat([tf.convert_to_tensor(p) for p in pieces], axis=0)
            )
        return tf.nest.pack_sequence_as(sources, out)

    gradient.__doc__ = upstream.__doc__
    return gradient


def make_sharded_weight_decay(upstream):
    """``TFOptimizer._apply_weight_decay`` that decays sharded variables directly."""

    def _apply_weight_decay(self, variables):
        variables = list(variables)
        plain = [v for v in variables if shards_of(v) is None]
        if len(plain) == len(variables) or self.weight_decay is None:
            return upstream(self, variables)
        if plain:
            upstream(self, plain)
        for variable in variables:
            inner = getattr(variable, "_value", variable)
            # Keras's own per-variable exclusion rule (private).
            if is_sharded_variable(inner) and self._use_weight_decay(variable):
                lr = tf.cast(self.learning_rate, inner.dtype)
                wd = tf.cast(self.weight_decay, inner.dtype)
                inner.assign_sub(tf.convert_to_tensor(inner) * wd * lr)

    return _apply_weight_decay


def make_sharded_slot(upstream):
    """``TFOptimizer.add_variable_from_reference`` without colocation for sharded references."""
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    def add_variable_from_reference(self, reference_variable, name=None, initializer="zeros"):
        if shards_of(reference_variable) is None:
            return upstream(self, reference_variable, name=name, initializer=initializer)
        # What TFOptimizer's own version calls, minus the colocation.
        return BaseOptimizer.add_variable_from_reference(
            self, reference_variable, name=name, initializer=initializer
        )

    return add_variable_from_reference


# -- probes ---------------------------------------------------------------------
def keras_updates_sharded_through_extended_update(fn: Any = None) -> bool:
    """True while Keras's TF optimizer applies a ShardedVariable's update via ``extended.update``.

    ``extended.update`` colocates with the variable, which a ShardedVariable refuses.
    """
    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    fn = fn or original("sharded_variables") or TFOptimizer._distributed_tf_update_step
    sharded = type("ShardedVariable", (), {})()  # is_sharded_variable goes by the type's name
    optimizer = type("Optimizer", (), {"update_step": lambda self, g, v, lr: None})()
    distribution = RecordingStrategy()
    fn(optimizer, distribution, [(1.0, sharded)], 0.1)
    return ("update", sharded) in distribution.calls


def sharded_variable_lacks_array() -> bool:
    """True while TF's ``ShardedVariable`` has no ``__array__`` (Keras's ``__array__`` calls it)."""
    from tensorflow.python.distribute.sharded_variable import ShardedVariable

    return not hasattr(ShardedVariable, "__array__")


def sharded_variables_lack_handle() -> bool:
    """True while a ``ShardedVariable`` has no ``handle`` (so the tape cannot take it)."""
    from tensorflow.python.distribute.sharded_variable import ShardedVariable

    return not hasattr(ShardedVariable, "handle")


def keras_weight_decay_uses_extended_update(fn: Any = None) -> bool:
    """True while Keras's TF optimizer (or ``fn``) applies weight decay via ``extended.update``."""
    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    fn = fn or original("sharded_weight_decay") or TFOptimizer._apply_weight_decay
    return "extended.update" in inspect.getsource(fn)


def keras_slots_colocate_with_reference(fn: Any = None) -> bool:
    """True while Keras's TF optimizer (or ``fn``) creates slots under ``colocate_vars_with``."""
    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    fn = fn or original("sharded_slots") or TFOptimizer.add_variable_from_reference
    return "colocate_vars_with" in inspect.getsource(fn)
