"""A Keras variable's TF storage held apart, and a TF variable's buffer emptied and refilled.

Sharded parameters (ZeRO-3, `tfdist.training.zero.parameters`) keep two TF variables per
trainable weight for the life of the Trainer: the model's own (whole) and its block (one
``[S]`` per replica). Only one of them holds values at a time: during a fit the blocks, between
fits the whole variables; the other's buffer is an empty ``[0]`` tensor, so a worker never holds
the whole model beside its blocks. Keeping the same TF variables (rather than making new ones
each fit) keeps what was traced on them (the compiled step, the optimizer's slot keys) valid.
Neither has a public hook in Keras or TF, so these name the internals once:

- `storage_of`, `attach`, `detach`: a Keras variable's TF variable (``_value``) read, set back,
  or taken away with a read guard (``_initializer``: called by Keras on a read of a variable
  without storage, which then raises instead of handing back an initial value);
- `resize`: a TF variable's buffer on each replica replaced by a value of another shape
  (``AssignVariableOp`` with ``validate_shape=False``; ``Variable.assign`` checks the shape).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import keras
import tensorflow as tf


def storage_of(variable: keras.Variable) -> Any:
    """The TF variable behind ``variable`` (a distributed one in a strategy's scope), or None."""
    # Private: Keras's TF backend keeps it here; ``.value`` would autocast or call the guard.
    return variable._value


def attach(variable: keras.Variable, tf_variable: Any) -> None:
    """Gives ``variable`` back its TF variable (taken by `detach`)."""
    # Private: the one place Keras reads a variable's storage from.
    variable._value = tf_variable


def detach(variable: keras.Variable, guard: Callable[..., Any]) -> None:
    """Takes ``variable``'s TF variable away (keep it: `storage_of` first); a read outside a
    ``StatelessScope`` that maps it calls ``guard``, which should raise."""
    # Private: Keras calls ``_initializer`` for a variable whose ``_value`` is None.
    variable._value = None
    variable._initializer = guard


def resize(tf_variable: Any, values: Sequence[tf.Tensor]) -> None:
    """Replaces the buffer of each local component of ``tf_variable`` (a distributed variable, or
    a plain one) by ``values[k]``, of any shape (eager, cross-replica context). The old buffer is
    freed unless a tensor read from it is still alive. The variable's static shape stays."""
    components = getattr(tf_variable, "values", None) or (tf_variable,)
    if len(components) != len(values):
        raise ValueError(
            f"Cannot resize {tf_variable.name!r}: Received {len(values)} values. "
            f"Expected one per local component ({len(components)})."
        )
    for component, value in zip(components, values):
        with tf.device(component.device):
            # Private: validate_shape=False is what lets the buffer change its shape.
            tf.raw_ops.AssignVariableOp(
                resource=component.handle,
                value=tf.convert_to_tensor(value, component.dtype),
                validate_shape=False,
            )


def emptied(tf_variable: Any) -> None:
    """`resize` to ``[0]`` on every local component: the variable holds no bytes."""
    components = getattr(tf_variable, "values", None) or (tf_variable,)
    resize(tf_variable, [tf.zeros([0], c.dtype) for c in components])


def held_elements(tf_variable: Any) -> list[int]:
    """The elements each local component's buffer holds now (0 once `emptied`)."""
    components = getattr(tf_variable, "values", None) or (tf_variable,)
    return [int(tf.size(c.read_value())) for c in components]
