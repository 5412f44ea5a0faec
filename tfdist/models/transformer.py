"""A small Transformer encoder that classifies an image row by row.

An ``(H, W, C)`` input is read as a sequence of ``H`` tokens of ``W * C``
features: Dense projection to ``d_model`` plus a learned position embedding,
``num_layers`` pre-norm encoder blocks (self-attention and a feed-forward
network, each residual), global average pooling, float32 logits.
"""

from __future__ import annotations

import math

import keras

from tfdist.config import check_fraction, check_positive_int, invalid_argument


@keras.saving.register_keras_serializable(package="tfdist")
class PositionEmbedding(keras.layers.Layer):
    """Adds a learned embedding per sequence position to ``(batch, length, dim)`` inputs."""

    def build(self, input_shape):
        self.embedding = self.add_weight(
            shape=tuple(input_shape[1:]), initializer="random_normal", name="embedding"
        )

    def call(self, inputs):
        # Keras autocasts the variable to the compute dtype (bf16/fp16 under mixed precision).
        return inputs + self.embedding


def _encoder_block(x, *, d_model: int, num_heads: int, ff_dim: int, dropout: float, name: str):
    h = keras.layers.LayerNormalization(epsilon=1e-6, name=f"{name}_ln_0")(x)
    h = keras.layers.MultiHeadAttention(
        num_heads=num_heads, key_dim=d_model // num_heads, dropout=dropout, name=f"{name}_attention"
    )(h, h)
    x = keras.layers.Add(name=f"{name}_add_0")([x, h])
    h = keras.layers.LayerNormalization(epsilon=1e-6, name=f"{name}_ln_1")(x)
    h = keras.layers.Dense(ff_dim, activation="gelu", name=f"{name}_ff_0")(h)
    h = keras.layers.Dense(d_model, name=f"{name}_ff_1")(h)
    if dropout:
        h = keras.layers.Dropout(dropout, name=f"{name}_dropout")(h)
    return keras.layers.Add(name=f"{name}_add_1")([x, h])


def build(
    input_shape: tuple[int, ...],
    num_classes: int,
    *,
    num_layers: int = 2,
    d_model: int = 64,
    num_heads: int = 4,
    ff_dim: int = 128,
    dropout: float = 0.0,
) -> keras.Model:
    """Builds the Transformer classifier.

    Args:
        input_shape: ``(H, W, C)`` (H tokens of W*C features) or ``(length, features)``.
        num_classes: Number of logits.
        num_layers: Encoder blocks.
        d_model: Token width; must be divisible by ``num_heads``.
        num_heads: Attention heads.
        ff_dim: Hidden width of each block's feed-forward network.
        dropout: Dropout rate in attention and after the feed-forward network.

    Returns:
        A functional ``keras.Model`` named "transformer" that outputs float32 logits.
    """
    if len(input_shape) not in (2, 3):
        raise invalid_argument(
            "input_shape", input_shape, "(H, W, C) or (length, features) for model 'transformer'"
        )
    for arg, value in (
        ("num_layers", num_layers),
        ("d_model", d_model),
        ("num_heads", num_heads),
        ("ff_dim", ff_dim),
    ):
        check_positive_int(arg, value)
    check_fraction("dropout", dropout)
    if d_model % num_heads:
        raise invalid_argument("d_model", d_model, f"a multiple of num_heads ({num_heads})")
    length, features = input_shape[0], math.prod(input_shape[1:])
    inputs = keras.Input(shape=input_shape, name="inputs")
    x = keras.layers.Reshape((length, features), name="rows_as_tokens")(inputs)
    x = keras.layers.Dense(d_model, name="token_projection")(x)
    x = PositionEmbedding(name="position_embedding")(x)
    for i in range(num_layers):
        x = _encoder_block(
            x,
            d_model=d_model,
            num_heads=num_heads,
            ff_dim=ff_dim,
            dropout=dropout,
            name=f"encoder_{i}",
        )
    x = keras.layers.LayerNormalization(epsilon=1e-6, name="final_ln")(x)
    x = keras.layers.GlobalAveragePooling1D(name="pool")(x)
    outputs = keras.layers.Dense(num_classes, dtype="float32", name="logits")(x)
    return keras.Model(inputs, outputs, name="transformer")
