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


def _ignored_labels(n, seed):
    """Token ids and per-step labels, -1 (ignored) at random positions: uneven valid counts."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 10, (n, 5)).astype(np.int32)
    labels = rng.integers(0, 3, (n, 5)).astype(np.int32)
    return ids, np.where(rng.random((n, 5)) < 0.4, -1, labels).astype(np.int32)


def test_ignore_class_matches_one_big_batch_in_training_and_evaluation():
    """mirrored x2 on b == one device on 2b, for a loss that ignores a class (fit and evaluate).

    Each replica's valid count differs; the last batch (65 = 4 * 16 + 1) leaves one replica
    empty. Keras's own fit under a strategy would average the replicas' means instead.
    """
    x, y = _ignored_labels(65, 0)
    val = _ignored_labels(33, 1)

    def build():
        ids = keras.Input((5,), dtype="int32")
        logits = keras.layers.Dense(3)(keras.layers.Embedding(10, 4)(ids))
        model = keras.Model(ids, logits)
        rng = np.random.default_rng(3)
        model.set_weights([0.3 * rng.standard_normal(w.shape) for w in model.get_weights()])
        return model

    def run(strategy):
        trainer = tfdist.Trainer(
            build,
            strategy=strategy,
            optimizer=keras.optimizers.SGD(0.5),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=-1),
            metrics=["sparse_categorical_accuracy"],
        )
        fit = dict(batch_size=16, epochs=2, shuffle=False, validation_data=val, verbose=0)
        history = trainer.fit(x, y, **fit).history
        evaluated = trainer.evaluate(*val, batch_size=16, verbose=0, return_dict=True)
        return trainer.model.get_weights(), history, evaluated

    weights, history, evaluated = run(tfdist.make_strategy("mirrored", num_devices=2))
    ref_weights, ref_history, ref_evaluated = run(tfdist.make_strategy("one_device"))
    for a, b in zip(ref_weights, weights):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    assert sorted(history) == sorted(ref_history)
    for key in ref_history:
        np.testing.assert_allclose(history[key], ref_history[key], atol=1e-5, rtol=0, err_msg=key)
    for key in ref_evaluated:
        assert abs(evaluated[key] - ref_evaluated[key]) < 1e-5, key
