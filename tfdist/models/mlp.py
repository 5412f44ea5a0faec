"""A multilayer perceptron: Flatten, then Dense ReLU layers, then float32 logits.

Wide configurations make a FLOP-heavy benchmark, e.g.
``tfdist.models.get("mlp", hidden_units=(2048, 2048, 2048))``.
"""

from __future__ import annotations

from collections.abc import Sequence

import keras

from tfdist.config import check_fraction, invalid_argument


def build(
    input_shape: tuple[int, ...],
    num_classes: int,
    *,
    hidden_units: Sequence[int] = (256, 256),
    dropout: float = 0.0,
) -> keras.Model:
    """Builds the MLP.

    Args:
        input_shape: Per-example feature shape, e.g. ``(8, 8, 1)``.
        num_classes: Number of logits.
        hidden_units: Width of each hidden Dense ReLU layer, in order.
        dropout: Dropout rate after each hidden layer (0 disables it).

    Returns:
        A functional ``keras.Model`` named "mlp" that outputs float32 logits.
    """
    units_ok = not isinstance(hidden_units, (int, str)) and hasattr(hidden_units, "__iter__")
    if not units_ok or any(
        isinstance(u, bool) or not isinstance(u, int) or u < 1 for u in tuple(hidden_units)
    ):
        raise invalid_argument(
            "hidden_units", hidden_units, "a sequence of positive ints, e.g. (256, 256)"
        )
    hidden_units = tuple(hidden_units)
    check_fraction("dropout", dropout)
    inputs = keras.Input(shape=input_shape, name="inputs")
    x = keras.layers.Flatten(name="flatten")(inputs)
    for i, units in enumerate(hidden_units):
        x = keras.layers.Dense(units, activation="relu", name=f"dense_{i}")(x)
        if dropout:
            x = keras.layers.Dropout(dropout, name=f"dropout_{i}")(x)
    outputs = keras.layers.Dense(num_classes, dtype="float32", name="logits")(x)
    return keras.Model(inputs, outputs, name="mlp")
