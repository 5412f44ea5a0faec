"""Tiny model and data shared by the multi-process test jobs and their in-process references."""
import keras
import numpy as np
import tensorflow as tf

GLOBAL_BATCH = 16


def data(n=96, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype("float32")
    y = (x @ rng.normal(size=(6, 3))).argmax(1).astype("int32")
    return x, y


def dataset(n=96):
    return tf.data.Dataset.from_tensor_slices(data(n)).batch(GLOBAL_BATCH)


def builder(weights=None):
    def build():
        m = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)])
        if weights is not None:
            m.set_weights(weights)
        return m
    return build


def initial_weights():
    keras.utils.set_random_seed(1)
    return builder()().get_weights()
