"""``PipelineOptions(split_at="auto", stages=K)``: cut a model into stages of about equal
parameter bytes.

The places a model can be cut are the layers (its steps, nested models flattened:
`tfdist.training.pipeline.cut`) called once, but the last. Of
those, the ``K - 1`` cuts are chosen that make the largest stage's parameter bytes (its steps'
variables, trainable or not) the smallest; among equal choices, the earliest cuts. Parameter
bytes stand in for a stage's memory; a stage's time also depends on its activations, which
this does not weigh: name the cuts by hand to balance time (the benchmark in
``tfdist bench --benchmarks=pipeline`` shows both).
"""

from __future__ import annotations

import logging
from typing import Any

import keras

from tfdist.config import invalid_argument
from tfdist.training.pipeline.cut import Cuts

logger = logging.getLogger(__name__)


def layer_bytes(layer: Any, seen: set[int]) -> int:
    """Bytes of ``layer``'s variables not counted yet (``seen``: their ids, updated)."""
    total = 0
    for v in getattr(layer, "weights", None) or []:
        if id(v) in seen:
            continue
        seen.add(id(v))
        total += v.value.shape.num_elements() * v.value.dtype.size
    return total


def _best(weights: list[int], places: list[int], cuts: int) -> list[int]:
    """The ``cuts`` places that make the heaviest segment lightest (dynamic programming)."""
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    ends = places + [len(weights) - 1]  # a segment ends after a place, the last at the end

    def segment(start: int, end: int) -> int:  # layers start+1..end (start=-1: from the first)
        return prefix[end + 1] - prefix[start + 1]

    # best[j][e]: (heaviest segment, cuts) for j cuts whose last segment ends at ends[e].
    best: list[dict[int, tuple[int, list[int]]]] = [
        {e: (segment(-1, end), []) for e, end in enumerate(ends)}
    ]
    for _ in range(cuts):
        row: dict[int, tuple[int, list[int]]] = {}
        for e, end in enumerate(ends):
            options = [
                (max(best[-1][p][0], segment(ends[p], end)), best[-1][p][1] + [ends[p]])
                for p in range(e)
                if p < len(places) and p in best[-1]
            ]
            if options:
                row[e] = min(options, key=lambda o: (o[0], o[1]))
        best.append(row)
    return best[-1][len(ends) - 1][1]


def balanced_split(model: keras.Model, stages: int) -> list[str]:
    """The names of the ``stages - 1`` layers to cut ``model`` after, by parameter bytes.

    Raises:
        ValueError: Naming ``split_at``, when the model has fewer places to cut.
    """
    cuts = Cuts(model, "auto")
    names = cuts.points()
    name_at: dict[int, str] = {}  # one name per place (a nested model's: its last layer's)
    for name, place in cuts.names().items():
        if name in names:
            name_at.setdefault(place, name)
    if len(name_at) < stages - 1:
        raise invalid_argument(
            "split_at",
            "auto",
            f"a model with at least {stages - 1} places to cut for stages={stages}",
            note=f"{model.name!r} can be cut only after {names or 'none of its layers'} (each "
            "a layer called once, but the last).",
        )
    seen: set[int] = set()
    weights = [layer_bytes(step.operation, seen) for step in cuts.steps]
    chosen = _best(weights, sorted(name_at), stages - 1)
    names = [name_at[i] for i in chosen]
    bounds = [-1, *chosen, len(weights) - 1]
    sizes = [sum(weights[a + 1 : b + 1]) for a, b in zip(bounds, bounds[1:])]
    logger.info(
        "Pipeline split_at='auto': cut after %s; stages of %s bytes of variables.",
        ", ".join(names),
        ", ".join(str(s) for s in sizes),
    )
    return names
