"""A small residual network: a conv stem, residual blocks with BatchNorm, float32 logits.

BatchNormalization makes this the model that exercises synchronised
(cross-replica) statistics under a strategy.
"""

from __future__ import annotations

import keras

from tfdist.config import check_positive_int, invalid_argument


def _residual_block(x, filters: int, name: str):
    shortcut = x
    x = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"{name}_conv_0")(x)
    x = keras.layers.BatchNormalization(name=f"{name}_bn_0")(x)
    x = keras.layers.ReLU(name=f"{name}_relu_0")(x)
    x = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"{name}_conv_1")(x)
    x = keras.layers.BatchNormalization(name=f"{name}_bn_1")(x)
    x = keras.layers.Add(name=f"{name}_add")([shortcut, x])
    return keras.layers.ReLU(name=f"{name}_relu_1")(x)


def build(
    input_shape: tuple[int, ...], num_classes: int, *, num_blocks: int = 2, filters: int = 32
) -> keras.Model:
    """Builds the ResNet.

    Args:
        input_shape: Per-example image shape ``(height, width, channels)``.
        num_classes: Number of logits.
        num_blocks: Residual blocks (two 3x3 convs with BatchNorm each).
        filters: Channels in the stem and every block.

    Returns:
        A functional ``keras.Model`` named "resnet" that outputs float32 logits.
    """
    if len(input_shape) != 3:
        raise invalid_argument(
            "input_shape", input_shape, "(height, width, channels) for model 'resnet'"
        )
    check_positive_int("num_blocks", num_blocks)
    check_positive_int("filters", filters)
    inputs = keras.Input(shape=input_shape, name="inputs")
    x = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False, name="stem_conv")(inputs)
    x = keras.layers.BatchNormalization(name="stem_bn")(x)
    x = keras.layers.ReLU(name="stem_relu")(x)
    for i in range(num_blocks):
        x = _residual_block(x, filters, name=f"block_{i}")
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    outputs = keras.layers.Dense(num_classes, dtype="float32", name="logits")(x)
    return keras.Model(inputs, outputs, name="resnet")
