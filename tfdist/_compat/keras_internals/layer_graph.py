"""A functional Keras model's graph as a list of calls, nested models flattened, for pipeline cuts.

Keras keeps a functional model's graph only in private attributes: a model's ``_nodes_by_depth``
(each node: one call of a layer or an op, with its ``arguments`` and ``outputs``), a
``Sequential``'s inner ``_functional``, a functional model's ``_inputs_struct``. `layer_graph`
reads them into `Step`s in the order Keras runs them, and `LayerGraph.replay` calls a run of
steps again on other symbolic tensors (each stage's sub-model is built so, sharing the layers).

A nested functional model (a KerasHub backbone inside a model that calls it) called once, with
inputs of its own structure, is *flattened*: its steps take the place of its call, named
``"<nested model>/<layer>"``, so that a pipeline can cut between them. Its input tensors are
*aliases* of the tensors it was called on, and the tensors its call made are aliases of its
outputs (`LayerGraph.canonical`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import keras


@dataclasses.dataclass
class Step:
    """One call of a layer (or a ``keras.ops`` operation) in the flattened graph.

    Attributes:
        operation: The layer or operation called.
        name: Its name, ``"<nested model>/<name>"`` inside a flattened nested model.
        arguments: Keras's record of the call's arguments (``SymbolicArguments``).
        consumes: The canonical tensors it reads.
        produces: The canonical tensors it makes.
    """

    operation: Any
    name: str
    arguments: Any
    consumes: list[Any]
    produces: list[Any]


@dataclasses.dataclass
class LayerGraph:
    """A model's steps in order, from its input structure to its output structure."""

    inputs: Any
    outputs: Any
    steps: list[Step] = dataclasses.field(default_factory=list)
    aliases: dict[int, Any] = dataclasses.field(default_factory=dict)
    #: A flattened nested model's name: the index of its last step.
    nested_ends: dict[str, int] = dataclasses.field(default_factory=dict)

    def canonical(self, tensor: Any) -> Any:
        """The tensor ``tensor`` stands for (itself, unless it is an alias)."""
        while id(tensor) in self.aliases:
            tensor = self.aliases[id(tensor)]
        return tensor

    def replay(self, steps: list[Step], values: dict[int, Any]) -> None:
        """Calls ``steps`` again, each on the values of what it consumes (``values``: a
        canonical tensor's id to its new symbolic tensor; what they make is added)."""
        for step in steps:
            lookup = {id(t): values[id(self.canonical(t))] for t in step.arguments.keras_tensors}
            args, kwargs = step.arguments.fill_in(lookup)
            made = keras.tree.flatten(step.operation(*args, **kwargs))
            for tensor, value in zip(step.produces, made):
                values[id(tensor)] = value


def _functional_class() -> type:
    from keras.src.models.functional import Functional

    return Functional


def graph_model(model: Any) -> Any:
    """The functional model whose graph ``model`` runs (a Sequential's inner one), or None."""
    functional = _functional_class()
    if isinstance(model, keras.Sequential):
        # Private: a built Sequential runs its layers as this functional model.
        inner = getattr(model, "_functional", None)
        return inner if type(model).call is keras.Sequential.call else None
    if isinstance(model, functional) and type(model).call is functional.call:
        return model
    return None


def layer_graph(model: keras.Model) -> LayerGraph | None:
    """``model``'s graph, nested models called once flattened; None without one (a subclassed
    model, a Sequential not built yet)."""
    inner = graph_model(model)
    if inner is None:
        return None
    # Private: a functional model's constructor structures (``input``/``output`` unpack one).
    graph = LayerGraph(inner._inputs_struct, inner._outputs_struct)
    _expand(inner, "", graph)
    return graph


def _ordered_nodes(functional: Any) -> list[Any]:
    """The nodes of ``functional``'s own graph in the order its ``call`` runs them."""
    # Private: Keras runs a functional model's nodes by decreasing depth, in this dict's order.
    by_depth = functional._nodes_by_depth
    return [n for d in sorted(by_depth, reverse=True) for n in by_depth[d] if not n.is_input]


def _expand(functional: Any, prefix: str, graph: LayerGraph) -> None:
    nodes = _ordered_nodes(functional)
    calls: dict[int, int] = {}
    for node in nodes:
        calls[id(node.operation)] = calls.get(id(node.operation), 0) + 1
    for node in nodes:
        op = node.operation
        inner = graph_model(op) if calls[id(op)] == 1 else None
        if inner is not None and _flattens(node, inner):
            flat = keras.tree.flatten(node.arguments.args[0])
            for inside, outside in zip(inner.inputs, flat):
                _alias(graph, inside, outside)  # often the same: a task calls backbone.input
            _expand(inner, f"{prefix}{op.name}/", graph)
            for made, inside in zip(node.outputs, inner.outputs):
                _alias(graph, made, inside)
            graph.nested_ends[f"{prefix}{op.name}"] = len(graph.steps) - 1
            continue
        consumes = [graph.canonical(t) for t in node.arguments.keras_tensors]
        graph.steps.append(
            Step(op, f"{prefix}{op.name}", node.arguments, consumes, list(node.outputs))
        )


def _alias(graph: LayerGraph, tensor: Any, stands_for: Any) -> None:
    if graph.canonical(stands_for) is not tensor:
        graph.aliases[id(tensor)] = stands_for


def _flattens(node: Any, inner: Any) -> bool:
    """Whether a nested model's call can be replaced by its steps: one positional argument of
    its inputs' structure, dtypes and ranks (nothing for its ``call`` to convert), no tensor
    among the keyword arguments, as many outputs as it has."""
    arguments = node.arguments
    if len(arguments.args) != 1 or len(node.outputs) != len(inner.outputs):
        return False
    if any(isinstance(t, keras.KerasTensor) for t in keras.tree.flatten(arguments.kwargs)):
        return False
    try:
        keras.tree.assert_same_structure(
            keras.tree.lists_to_tuples(arguments.args[0]),
            keras.tree.lists_to_tuples(inner._inputs_struct),
        )
    except (TypeError, ValueError):
        return False
    flat = keras.tree.flatten(arguments.args[0])
    return all(
        isinstance(a, keras.KerasTensor) and a.dtype == b.dtype and len(a.shape) == len(b.shape)
        for a, b in zip(flat, inner.inputs)
    )
