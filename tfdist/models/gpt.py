"""A decoder-only transformer language model (GPT), one float32 logit vector per position.

``(seq_len,)`` int32 token ids: a token embedding plus a learned position embedding, ``depth``
pre-norm blocks (LayerNorm, causal multi-head self-attention, residual; LayerNorm, a GELU MLP
of ``4 * width``, residual), a final LayerNorm and ``Dense(num_classes, dtype="float32")``
logits of shape ``(batch, seq_len, num_classes)``: position ``t``'s logits predict token
``t + 1`` from tokens ``0..t`` only.

The model is one flat functional graph whose layers are named by block: block ``i``'s layers
are ``block_{i}_ln_0``, ``block_{i}_attention``, ... and its last layer, the residual ``Add``
whose output is the block's output, is ``block_{i}`` itself. So
``PipelineOptions(split_at=["block_1"])`` cuts between blocks 1 and 2, and only the residual
stream crosses the cut (the causal mask is made inside each attention layer).
"""

from __future__ import annotations

import keras

from tfdist.config import check_fraction, check_positive_int, invalid_argument
from tfdist.models.transformer import PositionEmbedding

_EPSILON = 1e-5


def _block(x, *, width: int, heads: int, dropout: float, name: str):
    h = keras.layers.LayerNormalization(epsilon=_EPSILON, name=f"{name}_ln_0")(x)
    h = keras.layers.MultiHeadAttention(
        num_heads=heads, key_dim=width // heads, dropout=dropout, name=f"{name}_attention"
    )(h, h, use_causal_mask=True)
    x = keras.layers.Add(name=f"{name}_add_0")([x, h])
    h = keras.layers.LayerNormalization(epsilon=_EPSILON, name=f"{name}_ln_1")(x)
    h = keras.layers.Dense(4 * width, activation="gelu", name=f"{name}_mlp_0")(h)
    h = keras.layers.Dense(width, name=f"{name}_mlp_1")(h)
    if dropout:
        h = keras.layers.Dropout(dropout, name=f"{name}_dropout")(h)
    return keras.layers.Add(name=name)([x, h])


def build(
    input_shape: tuple[int, ...],
    num_classes: int,
    *,
    width: int = 128,
    depth: int = 4,
    heads: int = 4,
    dropout: float = 0.0,
    vocabulary_size: int | None = None,
) -> keras.Model:
    """Builds the GPT.

    Args:
        input_shape: ``(seq_len,)``: token ids per example.
        num_classes: Logits per position (the vocabulary to predict: 256 for bytes).
        width: Embedding and residual width; a multiple of ``heads``.
        depth: Transformer blocks, named ``block_0`` ... ``block_{depth - 1}``.
        heads: Attention heads per block.
        dropout: Dropout rate after the embeddings, in attention and after each MLP.
        vocabulary_size: Token ids the embedding reads; None: ``num_classes``.

    Returns:
        A functional ``keras.Model`` named "gpt" outputting float32 logits of shape
        ``(batch, seq_len, num_classes)``.
    """
    if len(input_shape) != 1:
        raise invalid_argument("input_shape", input_shape, "(seq_len,) for model 'gpt'")
    for arg, value in (("width", width), ("depth", depth), ("heads", heads)):
        check_positive_int(arg, value)
    check_positive_int("vocabulary_size", vocabulary_size, allow_none=True)
    check_fraction("dropout", dropout)
    if width % heads:
        raise invalid_argument("width", width, f"a multiple of heads ({heads})")
    tokens = keras.Input(shape=input_shape, dtype="int32", name="tokens")
    x = keras.layers.Embedding(vocabulary_size or num_classes, width, name="token_embedding")(
        tokens
    )
    x = PositionEmbedding(name="position_embedding")(x)
    if dropout:
        x = keras.layers.Dropout(dropout, name="embedding_dropout")(x)
    for i in range(depth):
        x = _block(x, width=width, heads=heads, dropout=dropout, name=f"block_{i}")
    x = keras.layers.LayerNormalization(epsilon=_EPSILON, name="final_ln")(x)
    logits = keras.layers.Dense(num_classes, dtype="float32", name="logits")(x)
    return keras.Model(tokens, logits, name="gpt")
