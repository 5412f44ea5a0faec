"""Sharding (ZeRO-1/2) of transformers against plain Keras ``fit`` on one device, mirrored x2.

A ``Dense`` layer on 3-D input has a kernel gradient of partly unknown static shape, and an
``Embedding``'s gradient is a ``tf.IndexedSlices`` whose duplicate rows Keras's Adam squares
apart: the block layout must come from the variables' shapes, and each replica's block of a
sparse gradient must stay sparse. Each run is compared with plain Keras on one device with the
same global batch (tests/keras_parity/parity.py's harness), to 1e-5.
"""

import dataclasses
import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.keras_parity.parity import Row, assert_same, fixed_weights, run_keras, run_trainer
from tfdist.training.zero.layout import block_slices, blocks

VOCAB, SEQ, WIDTH, N, BATCH = 7, 6, 8, 32, 16


class PositionEmbedding(keras.layers.Layer):
    """Learned positions, cut to the input's length (a gradient of unknown static shape)."""

    def build(self, input_shape):
        self.positions = self.add_weight(shape=(SEQ, WIDTH), name="positions")

    def call(self, x):
        length = keras.ops.shape(x)[1]
        return x + keras.ops.slice(self.positions, [0, 0], [length, WIDTH])


def lm():
    """A one-block causal transformer LM: token and position embeddings, causal attention,
    Dense on 3-D input, LayerNormalization; next-token logits."""
    ids = keras.Input((None,), dtype="int32")
    h = PositionEmbedding()(keras.layers.Embedding(VOCAB, WIDTH)(ids))
    a = keras.layers.LayerNormalization()(h)
    # No biases: a key bias's gradient is zero up to rounding (softmax ignores a shift), which
    # Adam would turn into steps of its learning rate.
    a = keras.layers.MultiHeadAttention(2, WIDTH // 2, use_bias=False)(a, a, use_causal_mask=True)
    h = keras.layers.Add()([h, a])
    m = keras.layers.Dense(2 * WIDTH, activation="gelu")(keras.layers.LayerNormalization()(h))
    h = keras.layers.Add()([h, keras.layers.Dense(WIDTH)(m)])
    return fixed_weights(keras.Model(ids, keras.layers.Dense(VOCAB)(h)))


def text():
    """Sequences of a 6-token vocabulary: every token repeats within every batch."""
    ids = np.random.default_rng(0).integers(1, VOCAB, (N, SEQ + 1)).astype(np.int32)
    return ids[:, :-1], ids[:, 1:]


OPTIMIZERS = {
    "adam": lambda: keras.optimizers.Adam(0.02),
    "sgd": lambda: keras.optimizers.SGD(0.5),
    # Clipping reads whole tensors' norms: a sparse block's from its values, as Keras's does.
    "adam_global_clipnorm": lambda: keras.optimizers.Adam(0.02, global_clipnorm=0.05),
}


def lm_row(optimizer, sharding=None, k=1):
    def fit(batch):
        x, y = text()
        return lambda: dict(x=x, y=y, batch_size=batch, epochs=1, shuffle=False)

    return Row(
        f"lm_{optimizer}",
        lm,
        lambda: dict(
            optimizer=OPTIMIZERS[optimizer](),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        ),
        fit(BATCH // k),
        trainer=dict(sharding=sharding, accumulation_steps=k),
        keras_fit=fit(BATCH),
        strategies=("mirrored",),
        history_keys=("loss",),  # accumulation adds ``updates``
    )


@functools.cache
def reference(optimizer):
    return run_keras(lm_row(optimizer))


@functools.cache
def mirrored():
    return tfdist.make_strategy("mirrored", num_devices=2)


@pytest.mark.parametrize(
    "optimizer, sharding, k",
    [
        ("adam", "optimizer", 1),
        ("adam", "gradients", 2),  # dense blocks reduced each micro-batch, sparse rows kept
        # Keras's global clipping multiplies with ``*``: its optimizer gets the slices dense.
        ("adam_global_clipnorm", "optimizer", 1),
    ],
)
def test_a_transformer_trains_sharded_as_keras_on_one_device(optimizer, sharding, k):
    row = lm_row(optimizer, sharding, k)
    assert_same(row, reference(optimizer), run_trainer(row, mirrored()))


def test_a_replicas_block_of_sparse_rows_keeps_their_duplicates():
    # Rows 2 and 5 of a (7, 3) tensor, row 2 twice: replica r of 3 holds elements 7r..7r+6.
    values = np.arange(9, dtype=np.float32).reshape(3, 3) + 1
    rows = tf.IndexedSlices(tf.constant(values), tf.constant([2, 5, 2]), tf.constant([7, 3]))
    whole = blocks(tf.convert_to_tensor(rows), 3).numpy()
    squares = 0.0
    for r in range(3):
        mine = block_slices(rows, tf.TensorShape([7, 3]), 3, tf.constant(r))
        np.testing.assert_array_equal(tf.convert_to_tensor(mine).numpy(), whole[r])
        squares += float(tf.reduce_sum(mine.values**2))
    # Every element of every row, duplicates apart: the sum of squares Adam's moment sees.
    assert squares == float(np.sum(values**2))
    first = block_slices(rows, tf.TensorShape([7, 3]), 3, tf.constant(0))
    assert first.indices.numpy().tolist() == [6, 6] and first.values.numpy().tolist() == [1, 7]


def gpt2():
    """KerasHub's GPT-2 backbone from its constructor (random weights, nothing downloaded),
    with a Dense head over its 3-D output."""
    import keras_hub

    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=VOCAB,
        num_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        dropout=0.0,
        max_sequence_length=16,
    )
    inputs = {
        "token_ids": keras.Input((None,), dtype="int32", name="token_ids"),
        "padding_mask": keras.Input((None,), dtype="int32", name="padding_mask"),
    }
    return fixed_weights(keras.Model(inputs, keras.layers.Dense(VOCAB)(backbone(inputs))))


def test_a_keras_hub_gpt2_backbone_trains_sharded_with_adam_as_keras_on_one_device():
    x, y = text()
    mask = (np.arange(SEQ)[None, :] < np.random.default_rng(1).integers(3, SEQ + 1, (N, 1))).astype(
        np.int32
    )
    row = Row(
        "gpt2_backbone_adam",
        gpt2,
        lambda: dict(
            optimizer=keras.optimizers.Adam(0.02),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        ),
        lambda: dict(
            x={"token_ids": x * mask, "padding_mask": mask},
            y=y,
            batch_size=BATCH,
            epochs=1,
            shuffle=False,
        ),
        trainer=dict(sharding="gradients"),
        strategies=("mirrored",),
    )
    assert_same(row, run_keras(row), run_trainer(row, mirrored()))


def test_sparse_dense_sums_the_rows_first_sharded_as_unsharded():
    # ExchangeOptions(sparse="dense"): each micro-batch's rows summed into a dense gradient before
    # it is reduce-scattered, as the unsharded exchange all-reduces it (Horovod's sparse_as_dense).
    def fit(sharding):
        exchange = tfdist.ExchangeOptions(sharding=sharding, sparse="dense")
        row = dataclasses.replace(
            lm_row("adam", k=2), trainer=dict(accumulation_steps=2, exchange=exchange)
        )
        return run_trainer(row, mirrored()).weights

    plain, sharded = fit(None), fit("gradients")
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(plain, sharded)) <= 1e-6
