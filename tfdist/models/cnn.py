"""A small convolutional classifier: two 3x3 convs, max-pool, Dense, float32 logits.

Reaches >= 0.95 validation accuracy on "digits" in a few epochs with
``Adam(1e-3)`` and a global batch of 128.
"""

from __future__ import annotations

import keras

from tfdist.config import check_fraction, invalid_argument


def build(input_shape: tuple[int, ...], num_classes: int, *, dropout: float = 0.25) -> keras.Model:
    """Builds the CNN.

    Args:
        input_shape: Per-example image shape ``(height, width, channels)``.
        num_classes: Number of logits.
        dropout: Dropout rate before the logits.

    Returns:
        A functional ``keras.Model`` named "cnn" that outputs float32 logits.
    """
    if len(input_shape) != 3:
        raise invalid_argument(
            "input_shape", input_shape, "(height, width, channels) for model 'cnn'"
        )
    check_fraction("dropout", dropout)
    inputs = keras.Input(shape=input_shape, name="inputs")
    x = keras.layers.Conv2D(32, 3, activation="relu", padding="same", name="conv_0")(inputs)
    x = keras.layers.Conv2D(64, 3, activation="relu", padding="same", name="conv_1")(x)
    x = keras.layers.MaxPool2D(name="pool")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    x = keras.layers.Dense(128, activation="relu", name="dense")(x)
    x = keras.layers.Dropout(dropout, name="dropout")(x)
    outputs = keras.layers.Dense(num_classes, dtype="float32", name="logits")(x)
    return keras.Model(inputs, outputs, name="cnn")
