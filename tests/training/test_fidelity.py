"""Numerical fidelity: N replicas x b equals 1 replica x N*b (float32, SGD)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.jobs.common import GLOBAL_BATCH
from tests.jobs.common import builder as _builder
from tests.jobs.common import data as _data
from tests.jobs.common import initial_weights as _initial_weights


def _train(strategy, weights, data, **fit_kwargs):
    trainer = tfdist.Trainer(
        _builder(weights),
        strategy=strategy,
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    trainer.fit(data, epochs=2, verbose=0, **fit_kwargs)
    return [np.asarray(w) for w in trainer.model.get_weights()]


def _keras_fit(weights, data):
    """The independent reference: plain Keras ``fit`` on one device, the same global batches."""
    model = _builder(weights)()
    model.compile(
        keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    model.fit(data, epochs=2, verbose=0)
    return model.get_weights()


@pytest.mark.parametrize(
    "kind,options",
    [("one_device", {}), ("mirrored", {"num_devices": 2}), ("mirrored", {"num_devices": 4})],
)
def test_replicas_match_one_big_batch(kind, options):
    x, y = _data()
    w0 = _initial_weights()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
    reference = _keras_fit(w0, ds)  # 1 replica x the whole global batch
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
    for a, b in zip(_keras_fit(w0, ds), got):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
