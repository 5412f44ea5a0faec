"""The cut of a model into pipeline stages: where it can be cut, what crosses each cut.

A model's *steps* are its layers' calls in the order Keras runs them, with a nested functional
model called once (a KerasHub backbone inside the model that calls it) flattened into its own
steps, named ``"<nested model>/<layer>"`` (`tfdist._compat.keras_internals.layer_graph`). A cut
after layer
``L`` puts the steps up to ``L``'s in one stage and the rest after it (naming a flattened
nested model cuts after its last step). Every tensor made before the cut (or an input of the
model) and read after it *crosses* the cut: the stage before outputs it, the stage after takes
it as an input, and a stage that does not read it passes it on. So a padding mask, a causal
mask, position ids or a residual stream that several stages need travel with the activations,
and so does a Keras mask (``Embedding(mask_zero=True)``'s: a tensor of the graph, which the
layers that read it take as their ``mask`` argument, and which rides on the tensors that cross
at run time: `tfdist.training.pipeline.schedule.stage_forward`).

Refused, one error each, naming the layer and listing the cuts that would work: a name the
model's steps do not have, a layer called more than once (which call would the cut follow?),
an input layer or the last step (a stage would be empty), cuts out of order.

A layer called on both sides of a cut (a tied embedding: KerasHub's ``GPT2CausalLM`` reads its
token embedding in the backbone and again in its head) is in both stages' sub-models; its
variables live on the first one's device (`tfdist.training.pipeline.options.place_stages`), and each
stage's backward adds the gradient of its own reads. Each stage's sub-model
(`Cuts.stage_models`) calls the same layers again on its own inputs.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import keras

from tfdist._compat.keras_internals.layer_graph import LayerGraph, layer_graph
from tfdist.config import invalid_argument

logger = logging.getLogger(__name__)

#: How many names an error lists before "...".
SHOWN = 12


@dataclasses.dataclass(frozen=True)
class Span:
    """A tensor's life in the steps: made at ``made`` (-1: an input), last read at ``last``
    (``len(steps)``: an output of the model)."""

    tensor: Any
    made: int
    last: int


def _shown(names: Sequence[str]) -> str:
    return ", ".join(names[:SHOWN]) + (", ..." if len(names) > SHOWN else "") or "none"


class Cuts:
    """Where ``model`` can be cut, and what crosses each cut (analysis only, nothing built).

    Args:
        model: A built ``Sequential`` or functional ``keras.Model``.
        split_at: The names asked for (shown in errors).

    Raises:
        ValueError: Naming ``pipeline``, for a model with no layer graph (subclassed).
    """

    def __init__(self, model: keras.Model, split_at: Any) -> None:
        graph = layer_graph(model)
        if graph is None:
            raise invalid_argument(
                "pipeline",
                f"PipelineOptions(split_at={split_at!r})",
                "None for a model that is not a Sequential or functional keras.Model",
                note=f"{type(model).__name__} has no layer graph to cut at named layers.",
            )
        self.model, self.graph = model, graph
        self.steps = graph.steps
        self.spans = self._spans(graph)

    @staticmethod
    def _spans(graph: LayerGraph) -> list[Span]:
        spans: dict[int, Span] = {}
        for t in keras.tree.flatten(graph.inputs):
            spans[id(t)] = Span(t, -1, -1)
        for i, step in enumerate(graph.steps):
            for t in step.consumes:
                spans[id(t)] = dataclasses.replace(spans[id(t)], last=i)
            for t in step.produces:
                spans[id(t)] = Span(t, i, i)
        end = len(graph.steps)
        for t in keras.tree.flatten(graph.outputs):
            t = graph.canonical(t)
            spans[id(t)] = dataclasses.replace(spans[id(t)], last=end)
        return list(spans.values())

    def crossing(self, p: int) -> list[Any]:
        """The tensors that cross a cut after step ``p``, in the order they were made."""
        return [s.tensor for s in self.spans if s.made <= p < s.last]

    def why_not(self, p: int) -> str | None:
        """Why the model cannot be cut after step ``p``, or None."""
        if p >= len(self.steps) - 1:
            return "the last stage would be empty"
        return None

    def names(self) -> dict[str, int]:
        """Every name ``split_at`` can give: a step's (of a layer called once) or a flattened
        nested model's, to the index of the step the cut follows."""
        count: dict[str, int] = {}
        for step in self.steps:
            count[step.name] = count.get(step.name, 0) + 1
        named = {
            s.name: i
            for i, s in enumerate(self.steps)
            if isinstance(s.operation, keras.layers.Layer) and count[s.name] == 1
        }
        named.update(self.graph.nested_ends)
        return dict(sorted(named.items(), key=lambda item: item[1]))

    def points(self) -> list[str]:
        """The names the model can be cut after, one cut at a time, in order."""
        return [name for name, p in self.names().items() if self.why_not(p) is None]

    def positions(self, split_at: Sequence[str]) -> list[int]:
        """The step each cut follows, checked; any set of valid single cuts is valid."""
        names, positions = self.names(), []
        inputs = [x.name for x in self.model.layers if isinstance(x, keras.layers.InputLayer)]
        for name in split_at:
            if name in inputs:
                raise self.refusal(split_at, f"The first stage would be empty before {name!r}.")
            if name not in names:
                calls = sum(s.name == name for s in self.steps)
                note = f"{name!r} is not one of them."
                if calls > 1:
                    note = f"{name!r} is called {calls} times; a cut follows a layer called once."
                raise invalid_argument(
                    "split_at",
                    list(split_at),
                    f"names of layers of {self.model.name!r}: {_shown(inputs + list(names))}",
                    note=note,
                )
            p = names[name]
            reason = self.why_not(p)
            if reason is not None:
                raise self.refusal(split_at, f"The model cannot be cut after {name!r}: {reason}.")
            if positions and p <= positions[-1]:
                before = split_at[len(positions) - 1]
                raise self.refusal(split_at, f"{name!r} does not come after {before!r}.")
            positions.append(p)
        return positions

    def refusal(self, split_at: Sequence[str], note: str) -> ValueError:
        """The error for a cut that cannot be made: the places that would work, and why."""
        return invalid_argument(
            "split_at",
            list(split_at),
            "layers the model can be cut after, in its order (" + _shown(self.points()) + ")",
            note=note,
        )

    def stage_models(self, positions: Sequence[int]) -> list[keras.Model]:
        """One functional sub-model per stage, sharing the model's layers: stage ``k`` takes
        what crosses cut ``k - 1`` (stage 0: the model's inputs) and returns what crosses cut
        ``k`` as a list (the last: the model's outputs)."""
        graph, bounds = self.graph, [-1, *positions, len(self.steps) - 1]
        stages = []
        for k in range(len(bounds) - 1):
            if k == 0:
                inputs: Any = graph.inputs
                values = {id(graph.canonical(t)): t for t in keras.tree.flatten(inputs)}
            else:
                inputs = [_input_like(t) for t in self.crossing(bounds[k])]
                values = {id(t): x for t, x in zip(self.crossing(bounds[k]), inputs)}
            graph.replay(self.steps[bounds[k] + 1 : bounds[k + 1] + 1], values)
            if k < len(bounds) - 2:
                outputs: Any = [values[id(t)] for t in self.crossing(bounds[k + 1])]
            else:
                flat = [values[id(graph.canonical(t))] for t in keras.tree.flatten(graph.outputs)]
                outputs = keras.tree.pack_sequence_as(graph.outputs, flat)
            stages.append(keras.Model(inputs, outputs, name=f"{self.model.name}_stage_{k}"))
        return stages


def _input_like(tensor: Any) -> Any:
    """A new symbolic input of ``tensor``'s shape (its batch axis included) and dtype."""
    return keras.Input(batch_shape=tensor.shape, dtype=tensor.dtype, sparse=tensor.sparse)


def cut(model: keras.Model, split_at: Sequence[str]) -> list[keras.Model]:
    """The built ``model`` as functional sub-models sharing its layers, one per stage."""
    cuts = Cuts(model, split_at)
    positions = cuts.positions(split_at)
    for name, p in zip(split_at, positions):
        crossing = [f"{t.dtype}{list(t.shape)}" for t in cuts.crossing(p)]
        logger.info("Pipeline cut after %s: %s cross it.", name, ", ".join(crossing))
    return cuts.stage_models(positions)
