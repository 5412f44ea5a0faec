"""Parity rows for what already worked: a compiled loss and metrics, sample weights in data."""

import keras
import numpy as np
import tensorflow as tf

from tests.keras_parity.parity import Row

N, FEATURES, CLASSES = 96, 6, 3


def arrays(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, FEATURES)).astype("float32")
    y = (x[:, 0] > 0).astype("int32") + (x[:, 1] > 0.5).astype("int32")
    w = rng.uniform(0.5, 2.0, N).astype("float32")
    return x, y, w


def mlp():
    keras.utils.set_random_seed(1)
    return keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dense(CLASSES),
        ]
    )


def sgd_compile():
    return dict(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )


def dataset_fit(with_weights=False):
    def fit():
        x, y, w = arrays()
        parts = (x, y, w) if with_weights else (x, y)
        return dict(x=tf.data.Dataset.from_tensor_slices(parts).batch(16), epochs=2)

    return fit


ROWS = [
    Row("dataset", mlp, sgd_compile, dataset_fit()),
    Row("dataset_sample_weight", mlp, sgd_compile, dataset_fit(with_weights=True)),
]
