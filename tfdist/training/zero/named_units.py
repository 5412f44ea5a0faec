"""The layers ``units=`` names (``ExchangeOptions(units=...)``, ZeRO-3): each gathered just
before its call and released after, gathered again for its backward, where its gradients are
reduce-scattered (`tfdist.training.zero.units`), as FSDP2's ``fully_shard`` on chosen modules
or its auto wrap policy's ``TransformerBlock``.

An entry is a layer class (every layer of that class, subclasses too) or a layer name; a layer
matches anywhere in the model: inside nested models and inside subclassed models and layers
(`tfdist._compat.keras_internals.unit_calls.all_layers`), where Keras's ``__call__`` of the
layer is intercepted (`tfdist._compat.keras_internals.unit_calls.calls_through`). Every
trainable weight outside all named units is gathered once for the step, on the step's tape.

Refused, each by name: a name that matches no layer, a class that matches none, a named layer
inside another named layer (the outer one would gather the inner one's weights with its own:
name one or the other), and the model itself named.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras

from tfdist._compat.keras_internals.unit_calls import all_layers
from tfdist.config import invalid_argument


def _matches(layer: Any, entry: Any) -> bool:
    return layer.name == entry if isinstance(entry, str) else isinstance(layer, entry)


def _label(entry: Any) -> str:
    return repr(entry) if isinstance(entry, str) else entry.__name__


def find_units(model: keras.Model, units: Sequence[Any]) -> list[Any]:
    """The layers of ``model`` that ``units`` names (classes or names), in the model's order.

    Raises:
        ValueError: Naming ``units``, for an entry that matches no layer, the model itself, or a
            named layer inside another.
    """
    layers = all_layers(model)
    for entry in units:
        if isinstance(entry, str) and entry == model.name:
            raise invalid_argument(
                "units",
                tuple(units),
                "names or classes of layers inside the model",
                note=f"{entry!r} is the model itself; without units= the model runs as it "
                "does now (a subclassed model: one unit).",
            )
        if not any(_matches(layer, entry) for layer in layers):
            names = sorted({layer.name for layer in layers})
            raise invalid_argument(
                "units",
                tuple(units),
                "names or classes of layers inside the model",
                note=f"{_label(entry)} matches no layer of {model.name!r} "
                f"(its layers: {', '.join(names[:20])}{', ...' if len(names) > 20 else ''}).",
            )
    found = [layer for layer in layers if any(_matches(layer, e) for e in units)]
    _check_not_nested(found, units)
    return found


def _check_not_nested(found: list[Any], units: Sequence[Any]) -> None:
    chosen = {id(layer) for layer in found}
    for outer in found:
        for inner in all_layers(outer):
            if id(inner) in chosen:
                raise invalid_argument(
                    "units",
                    tuple(units),
                    "layers none of which is inside another",
                    note=f"{inner.name!r} is inside {outer.name!r}, both named: the outer one "
                    "gathers the inner one's weights with its own. Name one or the other.",
                )
