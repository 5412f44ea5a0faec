"""Numerical fidelity: N replicas x b equals 1 replica x N*b (float32, SGD)."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist

GLOBAL_BATCH = 16


def _data(n=96, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype("float32")
    y = (x @ rng.normal(size=(6, 3))).argmax(1).astype("int32")
    return x, y


def _initial_weights():
    keras.utils.set_random_seed(1)
    return _builder()().get_weights()


def _builder(weights=None):
    def build():
        m = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)])
        if weights is not None:
            m.set_weights(weights)
        return m
    return build


def _train(strategy, weights, data, **fit_kwargs):
    trainer = tfdist.Trainer(
        _builder(weights), strategy=strategy, optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    trainer.fit(data, epochs=2, verbose=0, **fit_kwargs)
    return [np.asarray(w) for w in trainer.model.get_weights()]


@pytest.mark.parametrize("kind,options", [("one_device", {}), ("mirrored", {"num_devices": 2}),
                                          ("mirrored", {"num_devices": 4})])
def test_replicas_match_one_big_batch(kind, options):
    x, y = _data()
    w0 = _initial_weights()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
    reference = _train(tfdist.make_strategy("one_device"), w0, ds)
    got = _train(tfdist.make_strategy(kind, **options), w0, ds)
    moved = max(np.abs(a - b).max() for a, b in zip(w0, reference))
    assert moved > 1e-2  # training really changed the weights
    for a, b in zip(reference, got):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


@pytest.mark.parametrize("n", [90, 82])
def test_partial_last_batch_is_a_true_mean(n):
    # Batches of 16 over 4 replicas: the last global batch has 10 examples
    # (split unevenly) or 2 (two replicas get an empty batch).
    x, y = _data(n)
    w0 = _initial_weights()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
    reference = _train(tfdist.make_strategy("one_device"), w0, ds)
    got = _train(tfdist.make_strategy("mirrored", num_devices=4), w0, ds)
    for a, b in zip(reference, got):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def test_matches_plain_keras_fit():
    x, y = _data()
    w0 = _initial_weights()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
    got = _train(tfdist.make_strategy("mirrored", num_devices=2), w0, ds)
    model = _builder(w0)()
    model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(ds, epochs=2, verbose=0)
    for a, b in zip(model.get_weights(), got):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
