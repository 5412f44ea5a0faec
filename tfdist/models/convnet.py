"""A convolutional network whose size does not grow with the image: global max-pool, logits.

Blocks of two 3x3 ReLU convolutions, 2x2 max-pooling between blocks, a global max-pool and
float32 logits: no Dense layer over space, so the parameters (and a replica's gradient
exchange) stay small while the compute grows with the pixels. The default, ``filters=(32,
64)``, has 66k parameters and costs about 0.15 GFLOP per 32x32x3 example, forward and
backward: the compute-bound model of ``tfdist bench --benchmarks=time_to_accuracy``, which
learns "patterns" (a class motif anywhere in the image) in a few epochs.
"""

from __future__ import annotations

from collections.abc import Sequence

import keras

from tfdist.config import invalid_argument


def build(
    input_shape: tuple[int, ...], num_classes: int, *, filters: Sequence[int] = (32, 64)
) -> keras.Model:
    """Builds the convnet.

    Args:
        input_shape: Per-example image shape ``(height, width, channels)``.
        num_classes: Number of logits.
        filters: Channels of each block's two convolutions, in order; a 2x2 max-pool between
            blocks.

    Returns:
        A functional ``keras.Model`` named "convnet" that outputs float32 logits.
    """
    if len(input_shape) != 3:
        raise invalid_argument(
            "input_shape", input_shape, "(height, width, channels) for model 'convnet'"
        )
    sequence = not isinstance(filters, (int, str)) and hasattr(filters, "__iter__")
    if (
        not sequence
        or not tuple(filters)
        or any(isinstance(f, bool) or not isinstance(f, int) or f < 1 for f in tuple(filters))
    ):
        raise invalid_argument("filters", filters, "a non-empty sequence of positive ints")
    inputs = keras.Input(shape=input_shape, name="inputs")
    x = inputs
    for i, width in enumerate(tuple(filters)):
        if i:
            x = keras.layers.MaxPool2D(name=f"pool_{i}")(x)
        for j in range(2):
            x = keras.layers.Conv2D(
                width, 3, activation="relu", padding="same", name=f"conv_{i}_{j}"
            )(x)
    x = keras.layers.GlobalMaxPool2D(name="global_pool")(x)
    outputs = keras.layers.Dense(num_classes, dtype="float32", name="logits")(x)
    return keras.Model(inputs, outputs, name="convnet")
