"""A functional model called one layer at a time, and its units' losses read as given.

Sharded parameters (ZeRO-3, `tfdist.training.zero.parameters`) keep each trainable variable
only as one block per replica (their storage: `tfdist._compat.keras_internals.storage`), and
each layer runs with its weights gathered just before it. Keras has no public hook for it, so
these name its internals once:

- `call_by_layer`: ``Functional.call`` with each layer's call wrapped, as Keras's own
  ``operation_fn`` wraps it (``Functional._run_through_graph``; a Sequential through its
  ``_functional``); a nested model whose call is Keras's own run through its graph (a
  functional or Sequential model inside another, a KerasHub backbone inside its task) is run
  through its graph in turn, so that each of its layers is wrapped (`unit_layers`), and a Keras
  op on tensors (``x[:, 0]``, ``ops.concatenate``: no variables, no losses) is called as it is;
  a model whose call is its own (subclassed) is wrapped whole, one unit; Keras masks ride on
  the tensors between the calls (``_keras_mask``), set again on a graph's standardised inputs
  as ``Functional.call`` sets them;
- `losses_as`: ``model.losses`` read as given tensors (``_losses_override``, Keras's own hook
  for JAX's stateless step): the units' regularizers and ``add_loss`` terms, computed where
  their weights were gathered, enter Keras's ``compute_loss`` as the layers' own would;
- `all_layers`: every layer inside a model, subclassed ones too (``_flatten_layers``), where
  ``units=`` looks for the layers it names;
- `calls_through`: a layer's ``call`` intercepted (its instance's ``call`` attribute, which
  Keras's ``__call__`` reads) while a trace runs, so that a named unit inside an opaque
  (subclassed) ``call`` is gathered one call at a time;
- `scope_within`: a ``StatelessScope`` that holds the enclosing scope's mapping too (Keras
  reads only the innermost scope).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import keras
from keras.src.backend.common.stateless_scope import get_stateless_scope

from tfdist._compat.keras_internals.layer_graph import graph_model
from tfdist._compat.keras_internals.masks import keras_mask, with_keras_mask


def functional_graph(model: keras.Model) -> Any:
    """The functional graph that calls ``model``'s layers, or None (a subclassed model, or a
    Sequential without an ``Input``, has none until it is called)."""
    if isinstance(model, keras.Sequential):
        return getattr(model, "_functional", None)
    if hasattr(model, "_run_through_graph") and hasattr(model, "_standardize_inputs"):
        return model
    return None


def runs_its_graph(layer: Any) -> bool:
    """Whether ``layer`` is a built model whose call is Keras's own run through its functional
    graph (a functional or Sequential model, a KerasHub backbone; not one whose ``call`` a
    subclass overrides)."""
    return isinstance(layer, keras.Model) and layer.built and graph_model(layer) is not None


def unit_layers(model: keras.Model) -> list[Any]:
    """The layers `call_by_layer` wraps one at a time: ``model``'s own, each nested model that
    `runs_its_graph` replaced by its layers (recursively); ``[model]`` for a model that does not
    (subclassed: one unit)."""
    if not runs_its_graph(model):
        return [model]
    found: list[Any] = []
    for layer in model.layers:
        found.extend(unit_layers(layer) if runs_its_graph(layer) else [layer])
    return found


def call_by_layer(
    model: keras.Model,
    inputs: Any,
    wrap: Callable[[Any, dict[str, Any]], Callable[..., Any]],
    **ctx,
) -> Any:
    """``model(inputs, **ctx)`` with each layer ``op`` of `unit_layers` called through
    ``wrap(op, context)`` (``context``: the call-context arguments, ``training``, that Keras
    would pass it), as ``Functional.call`` runs it; nested models that `runs_its_graph` are
    run through their graphs in turn, Keras ops on tensors as they are. A model that does not
    `runs_its_graph` (subclassed, or a functional one with a ``call`` of its own) is one unit:
    ``wrap(model, context)(inputs)``.

    Keras masks travel on the tensors (``_keras_mask``) as in Keras's own call: each layer's
    ``__call__`` reads its inputs' masks and sets its outputs'; a model run through its graph
    sets its inputs' masks again on its standardised inputs, as ``Functional.call`` does.
    """
    if not runs_its_graph(model):
        return wrap(model, _context(model, ctx))(inputs)
    return _through_graph(graph_model(model), inputs, wrap, ctx)


def _context(op: Any, ctx: dict[str, Any]) -> dict[str, Any]:
    """The call-context arguments of ``ctx`` that ``op`` takes, as Keras's ``operation_fn``."""
    names = getattr(op, "_call_context_args", {})
    return {k: v for k, v in ctx.items() if k in names and v is not None}


def _through_graph(graph: Any, inputs: Any, wrap: Callable, ctx: dict, mask: Any = None) -> Any:
    """``graph`` (a functional model) run on ``inputs`` layer by layer (`call_by_layer`).
    ``mask``: the node's ``mask=`` argument; else the masks ``inputs`` carry, as Keras's
    ``Layer.__call__`` fills it in."""
    masks = (
        [keras_mask(t) for t in keras.tree.flatten(inputs)]
        if mask is None
        else keras.tree.flatten(mask)
    )
    inputs = graph._standardize_inputs(inputs)  # may make new tensors (a cast, a rank)
    for tensor, one in zip(inputs, masks):
        with_keras_mask(tensor, one)

    def operation_fn(op: Any) -> Callable[..., Any]:
        if not isinstance(op, keras.layers.Layer):
            return op
        if runs_its_graph(op):
            return functools.partial(_nested, op, wrap, _context(op, ctx))
        return wrap(op, _context(op, ctx))

    outputs = graph._run_through_graph(inputs, operation_fn=operation_fn)
    return outputs[0] if isinstance(outputs, (list, tuple)) and len(outputs) == 1 else outputs


def _nested(model: keras.Model, wrap: Callable, context: dict, *args: Any, **kwargs: Any) -> Any:
    """A nested ``model`` called as ``model(*args, **kwargs)`` at its node, run through its
    graph layer by layer (as ``Functional.call``: a ``mask=`` argument, or the masks its inputs
    carry, set on its inputs; the enclosing call's context over the node's own arguments, as
    Keras's ``operation_fn``)."""
    inputs = args[0] if args else kwargs.pop("inputs")
    mask = kwargs.pop("mask", None)
    own = {k: v for k, v in kwargs.items() if k in getattr(model, "_call_context_args", {})}
    return _through_graph(graph_model(model), inputs, wrap, {**own, **context}, mask)


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


def all_layers(model: keras.Model) -> list[Any]:
    """Every layer inside ``model`` (nested, subclassed ones' too), each once, depth first.
    Reason: Keras has no public recursive listing of a subclassed model's layers."""
    return list(model._flatten_layers(include_self=False, recursive=True))


_CALLS_LOCK = threading.Lock()
_INTERCEPTED: dict[int, list] = {}  # id(layer) -> [count of users, original call]


@contextlib.contextmanager
def calls_through(layers: Sequence[Any], dispatch: Callable[..., Any]) -> Iterator[None]:
    """While inside: ``layer(...)`` of each of ``layers`` runs ``dispatch(layer, call, args,
    kwargs)`` where Keras's ``Layer.__call__`` would run ``call(*args, **kwargs)`` (its own
    ``call``). Reason: Keras has no hook around a sublayer's call inside an opaque ``call``; its
    ``__call__`` reads ``self.call``, which an instance attribute shadows. Counted: the replicas'
    traces run in concurrent threads and share the layers (``dispatch`` tells them apart); the
    last one out restores the class's ``call``."""
    with _CALLS_LOCK:
        for layer in layers:
            held = _INTERCEPTED.setdefault(id(layer), [0, layer.call])
            if held[0] == 0:  # past Keras's attribute tracking
                object.__setattr__(layer, "call", _through(layer, held[1], dispatch))
            held[0] += 1
    try:
        yield
    finally:
        with _CALLS_LOCK:
            for layer in layers:
                held = _INTERCEPTED[id(layer)]
                held[0] -= 1
                if held[0] == 0:
                    object.__delattr__(layer, "call")
                    del _INTERCEPTED[id(layer)]


def _through(layer: Any, original: Callable, dispatch: Callable) -> Callable:
    """``original`` (``layer``'s own ``call``) routed through ``dispatch``, its signature
    kept (Keras's errors name the call's arguments)."""

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        return dispatch(layer, original, args, kwargs)

    return call


def scope_within(*, state_mapping: list, collect_losses: bool) -> keras.StatelessScope:
    """``keras.StatelessScope(state_mapping=..., collect_losses=...)`` that maps the
    enclosing scope's variables too (``state_mapping`` over them). Reason: Keras reads a
    variable from the innermost scope only, whose ``state_mapping`` is keyed by ``id``."""
    scope = keras.StatelessScope(state_mapping=state_mapping, collect_losses=collect_losses)
    outer = get_stateless_scope()
    if outer is not None:
        scope.state_mapping = {**outer.state_mapping, **scope.state_mapping}
    return scope
