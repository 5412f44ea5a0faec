"""Parity rows for masked losses: every masking source, each exact against one device.

A Keras mask (``Embedding(mask_zero=True)``, ``Masking``, a recurrent layer with
``return_sequences=True``) or a loss's ``ignore_class`` makes Keras divide by the
valid count of the batch. The Trainer weighs each masked term by the valid count of
all replicas (and micro-batches), so N replicas on ``b`` equal one device on ``N * b``.
The sequences have random lengths, so the replicas' valid counts differ. Tiny
models, 64 sequences of 6 steps, SGD.
"""

import keras
import numpy as np
import tensorflow as tf

from tests.keras_parity.parity import Row, fixed_weights

VOCAB, STEPS, CLASSES, FEATURES, N = 12, 6, 3, 2, 64


def sequences(n=N, seed=0):
    """Token ids padded with 0 (random lengths 1..STEPS), labels per step, -1 at padding."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((n, STEPS), np.int32)
    for i, length in enumerate(rng.integers(1, STEPS + 1, n)):
        ids[i, :length] = rng.integers(1, VOCAB, length)
    labels = rng.integers(0, CLASSES, (n, STEPS)).astype(np.int32)
    return ids, labels, np.where(ids > 0, labels, -1).astype(np.int32)


def tokens_model(mask_zero=True, recurrent=False, outputs=1):
    def make():
        ids = keras.Input((STEPS,), dtype="int32")
        h = keras.layers.Embedding(VOCAB, 4, mask_zero=mask_zero)(ids)
        if recurrent:
            h = keras.layers.SimpleRNN(4, return_sequences=True)(h)
        heads = [keras.layers.Dense(CLASSES, name=f"out{i}")(h) for i in range(outputs)]
        return fixed_weights(keras.Model(ids, heads if outputs > 1 else heads[0]))

    return make


def masking_model():
    x = keras.Input((STEPS, FEATURES))
    h = keras.layers.Masking(0.0)(x)
    out = keras.layers.Dense(1, kernel_regularizer=keras.regularizers.L2(0.01))(h)
    return fixed_weights(keras.Model(x, out))


def sgd(loss, metrics=(), **extra):
    def compile():
        return dict(
            optimizer=keras.optimizers.SGD(0.5), loss=loss(), metrics=list(metrics), **extra
        )

    return compile


def cross_entropy(**kwargs):
    return lambda: keras.losses.SparseCategoricalCrossentropy(from_logits=True, **kwargs)


def token_fit(labels="plain", validation=False, batch=16, epochs=2):
    def fit():
        ids, plain, ignored = sequences()
        y = {"plain": plain, "ignored": ignored}[labels]
        args = dict(x=ids, y=y, batch_size=batch, epochs=epochs, shuffle=False)
        if validation:
            ids_v, plain_v, ignored_v = sequences(24, seed=1)
            args["validation_data"] = (ids_v, {"plain": plain_v, "ignored": ignored_v}[labels])
        return args

    return fit


def masking_fit():
    ids, _, _ = sequences()
    rng = np.random.default_rng(2)
    x = rng.standard_normal((N, STEPS, FEATURES)).astype(np.float32) * (ids > 0)[..., None]
    y = rng.standard_normal((N, STEPS, 1)).astype(np.float32)
    return dict(x=x, y=y, batch_size=16, epochs=2, shuffle=False)


def two_outputs_dataset(batch):
    """Two heads: one by the Embedding's mask, one by ``ignore_class`` on unmasked tokens."""

    def fit():
        ids, plain, ignored = sequences()
        # The second head ignores every other valid token as well: another valid count.
        ignored[:, ::2] = -1
        data = tf.data.Dataset.from_tensor_slices((ids, {"out0": plain, "out1": ignored}))
        return dict(x=data.batch(batch), epochs=2)

    return fit


def two_outputs_compile():
    return dict(
        optimizer=keras.optimizers.SGD(0.5),
        loss={"out0": cross_entropy()(), "out1": cross_entropy(ignore_class=-1)()},
        loss_weights={"out0": 1.0, "out1": 0.5},
    )


class MaskedTrainStep(keras.Model):
    """A custom ``train_step`` (the Keras guide's pattern) on a masked sequence model."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.embedding = keras.layers.Embedding(VOCAB, 4, mask_zero=True)
        self.head = keras.layers.Dense(CLASSES)
        self.loss_tracker = keras.metrics.Mean(name="loss")

    def call(self, ids):
        return self.head(self.embedding(ids))

    @property
    def metrics(self):
        return [self.loss_tracker]

    def train_step(self, data):
        ids, y = data
        with tf.GradientTape() as tape:
            y_pred = self(ids, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(grads, self.trainable_variables)
        replicas = tf.distribute.get_replica_context().num_replicas_in_sync
        self.loss_tracker.update_state(loss * replicas)
        return {m.name: m.result() for m in self.metrics}


def masked_train_step_model():
    model = MaskedTrainStep()
    model(tf.zeros((1, STEPS), tf.int32))
    return fixed_weights(model)


def zero_weights_fit():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((N, FEATURES)).astype(np.float32)
    y = rng.standard_normal((N, 1)).astype(np.float32)
    weights = np.where(rng.random(N) < 0.4, 0.0, rng.random(N) + 0.5).astype(np.float32)
    return dict(x=x, y=y, sample_weight=weights, batch_size=16, epochs=2, shuffle=False)


def dense_model():
    x = keras.Input((FEATURES,))
    return fixed_weights(keras.Model(x, keras.layers.Dense(1)(x)))


ROWS = [
    Row(
        "masks_embedding_mask_zero",
        tokens_model(),
        sgd(cross_entropy(), metrics=["sparse_categorical_accuracy"]),
        token_fit(validation=True),
    ),
    Row(
        "masks_masking_layer_regularized",
        masking_model,
        sgd(lambda: keras.losses.MeanSquaredError(), metrics=["mae"]),
        masking_fit,
    ),
    Row(
        "masks_rnn_return_sequences",
        tokens_model(recurrent=True),
        sgd(cross_entropy()),
        token_fit(),
    ),
    Row(
        "masks_ignore_class",
        tokens_model(mask_zero=False),
        sgd(cross_entropy(ignore_class=-1), metrics=["sparse_categorical_accuracy"]),
        token_fit(labels="ignored", validation=True),
    ),
    Row(
        "masks_two_outputs_accumulation",
        tokens_model(outputs=2),
        two_outputs_compile,
        two_outputs_dataset(16),
        trainer=dict(accumulation_steps=2),
        keras_fit=two_outputs_dataset(32),
        # Keras counts its 2x batches as steps; the Trainer adds its own `updates` log.
        history_keys=("loss", "out0_loss", "out1_loss"),
    ),
    Row("masks_custom_train_step", masked_train_step_model, sgd(cross_entropy()), token_fit()),
    Row(
        # "mean_with_sample_weight" divides by the sum of the weights: zero weights count for none.
        "masks_zero_sample_weights",
        dense_model,
        sgd(lambda: keras.losses.MeanSquaredError(reduction="mean_with_sample_weight")),
        zero_weights_fit,
    ),
]
