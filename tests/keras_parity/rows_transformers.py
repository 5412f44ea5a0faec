"""Parity rows for transformers and embeddings trained with Adam and SGD.

An ``Embedding`` lookup's gradient is a ``tf.IndexedSlices``; Keras's Adam squares each of its
rows before duplicate rows are summed, so a token seen twice in a batch must reach the optimizer
as two rows on every strategy (the exchange gathers the replicas' rows, accumulation
concatenates the micro-batches'). The tokens here repeat within every batch. Tiny models: a
causal transformer LM (token and position embeddings, attention with a causal mask, Dense over
3-D input, LayerNormalization), an ``Embedding(mask_zero=True)`` GRU classifier, and a masked
sequence labeller.
"""

import keras
import numpy as np

from tests.keras_parity.parity import Row, fixed_weights
from tests.keras_parity.rows_masks import cross_entropy, token_fit, tokens_model

VOCAB, SEQ, WIDTH, N = 11, 8, 8, 64


class PositionEmbedding(keras.layers.Layer):
    """Learned positions added to the token embeddings (a dense ``(SEQ, WIDTH)`` gradient)."""

    def build(self, input_shape):
        self.positions = self.add_weight(shape=input_shape[1:], name="positions")

    def call(self, x):
        return x + self.positions


def lm_model():
    """A one-block causal transformer LM over token ids: next-token logits per position."""
    ids = keras.Input((SEQ,), dtype="int32")
    h = PositionEmbedding()(keras.layers.Embedding(VOCAB, WIDTH)(ids))
    a = keras.layers.LayerNormalization()(h)
    # No biases: a key bias's gradient is zero up to rounding (softmax ignores a shift), and
    # Adam turns rounding noise into steps of its learning rate, even under Keras's own strategies.
    a = keras.layers.MultiHeadAttention(2, WIDTH // 2, use_bias=False)(a, a, use_causal_mask=True)
    h = keras.layers.Add()([h, a])
    m = keras.layers.Dense(2 * WIDTH, activation="gelu")(keras.layers.LayerNormalization()(h))
    h = keras.layers.Add()([h, keras.layers.Dense(WIDTH)(m)])
    return fixed_weights(keras.Model(ids, keras.layers.Dense(VOCAB)(h)))


def gru_model():
    """``Embedding(mask_zero=True)`` into a GRU: one label per sequence."""
    ids = keras.Input((SEQ,), dtype="int32")
    h = keras.layers.Embedding(VOCAB, WIDTH, mask_zero=True)(ids)
    return fixed_weights(keras.Model(ids, keras.layers.Dense(3)(keras.layers.GRU(WIDTH)(h))))


def text(n=N, seed=0):
    """Token sequences of a small vocabulary (every token repeats in a batch), padded with 0."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, (n, SEQ + 1)).astype(np.int32)
    for i, length in enumerate(rng.integers(3, SEQ + 2, n)):
        ids[i, length:] = 0
    return ids


def lm_fit(batch=16, epochs=2):
    def fit():
        ids = text()
        args = dict(x=ids[:, :-1], y=ids[:, 1:], batch_size=batch, epochs=epochs, shuffle=False)
        valid = text(16, seed=1)
        return dict(args, validation_data=(valid[:, :-1], valid[:, 1:]))

    return fit


def gru_fit():
    ids = text()[:, :-1]
    labels = (ids.sum(axis=1) % 3).astype(np.int32)
    return dict(x=ids, y=labels, batch_size=16, epochs=2, shuffle=False)


def adam(loss, metrics=()):
    def compile():
        return dict(optimizer=keras.optimizers.Adam(0.01), loss=loss(), metrics=list(metrics))

    return compile


ROWS = [
    Row(
        "transformers_lm_adam",
        lm_model,
        adam(cross_entropy(), metrics=["sparse_categorical_accuracy"]),
        lm_fit(),
    ),
    Row(
        "transformers_lm_adam_ignore_class_accumulation",
        lm_model,
        adam(cross_entropy(ignore_class=0)),
        lm_fit(batch=8),
        trainer=dict(accumulation_steps=2),
        keras_fit=lm_fit(batch=16),
        history_keys=("loss",),  # validation batches differ in size (8 and 16), so do masked means
    ),
    Row(
        "transformers_gru_mask_zero_adam",
        gru_model,
        adam(cross_entropy()),
        gru_fit,
        strategies=("multi_worker", "parameter_server"),  # a GRU's trace: 4x the others' CPU
    ),
    Row(
        "transformers_masked_embedding_adam",
        tokens_model(),
        adam(cross_entropy(), metrics=["sparse_categorical_accuracy"]),
        token_fit(validation=True),
    ),
]
