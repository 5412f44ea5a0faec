"""A functional model called one top-level layer at a time, and Keras variables without storage.

Sharded parameters (ZeRO-3, `tfdist.training.zero.parameters`) keep each trainable variable
only as one block per replica: the model's Keras variables keep their shapes and no storage,
and each top-level layer runs with its weights gathered just before it. Keras has no public
hook for either, so these name its internals once:

- `call_by_layer`: ``Functional.call`` with each layer's call wrapped, as Keras's own
  ``operation_fn`` wraps it (``Functional._run_through_graph``; a Sequential through its
  ``_functional``);
- `drop_storage`: a Keras variable whose TF variable is released (``_value``);
- `guard_reads`: a read of such a variable outside a ``StatelessScope`` that maps it calls its
  initializer (``_initializer``), which then raises instead of handing back the initial value;
- `give_storage`: such a variable made whole again, a TF variable of its own (``_initialize``);
- `losses_as`: ``model.losses`` read as given tensors (``_losses_override``, Keras's own hook
  for JAX's stateless step): the units' regularizers and ``add_loss`` terms, computed where
  their weights were gathered, enter Keras's ``compute_loss`` as the layers' own would.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import keras


def functional_graph(model: keras.Model) -> Any:
    """The functional graph that calls ``model``'s layers, or None (a subclassed model, or a
    Sequential without an ``Input``, has none until it is called)."""
    if isinstance(model, keras.Sequential):
        return getattr(model, "_functional", None)
    if hasattr(model, "_run_through_graph") and hasattr(model, "_standardize_inputs"):
        return model
    return None


def call_by_layer(
    model: keras.Model,
    inputs: Any,
    wrap: Callable[[Any, dict[str, Any]], Callable[..., Any]],
    **ctx,
) -> Any:
    """``model(inputs, **ctx)`` with each top-level layer ``op`` called through
    ``wrap(op, context)`` (``context``: the call-context arguments, ``training``, that Keras
    would pass it), as ``Functional.call`` runs it.

    Raises:
        ValueError: If ``model`` has no functional graph (`functional_graph`).
    """
    graph = functional_graph(model)
    if graph is None:
        raise ValueError(f"{type(model).__name__} has no functional graph")
    inputs = graph._standardize_inputs(inputs)

    def operation_fn(op: Any) -> Callable[..., Any]:
        names = getattr(op, "_call_context_args", {})
        context = {k: v for k, v in ctx.items() if k in names and v is not None}
        return wrap(op, context)

    outputs = graph._run_through_graph(inputs, operation_fn=operation_fn)
    return outputs[0] if isinstance(outputs, (list, tuple)) and len(outputs) == 1 else outputs


def drop_storage(variable: keras.Variable) -> None:
    """Releases ``variable``'s TF variable (its shape, dtype and initializer stay)."""
    variable._value = None


def has_storage(variable: keras.Variable) -> bool:
    return variable._value is not None


def guard_reads(variable: keras.Variable, guard: Callable[..., Any]) -> None:
    """A read of storage-less ``variable`` outside a mapping scope calls ``guard`` (which
    raises), where Keras would call its initializer and return the initial value."""
    variable._initializer = guard


def give_storage(variable: keras.Variable, value: Any) -> None:
    """Gives storage-less ``variable`` a TF variable of its own holding ``value`` (call it in
    the strategy's scope: it is made there, as Keras made the first one)."""
    variable._initialize(value)


@contextlib.contextmanager
def losses_as(model: keras.Model, losses: list) -> Iterator[None]:
    """While inside: ``model.losses`` is ``losses`` (when there are any; Keras's own otherwise)."""
    model._losses_override = list(losses)
    try:
        yield
    finally:
        model._losses_override = []


def set_losses(model: keras.Model, losses: list) -> None:
    """``model.losses`` is ``losses`` until the next call (``[]``: Keras's own again)."""
    model._losses_override = list(losses)
