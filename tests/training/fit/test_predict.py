"""Trainer.predict on 4 mirrored replicas: exact, in input order, partial last batch included."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist

N, G = 50, 16  # 3 full global batches and one of 2 examples: replicas 1-3 get empty batches


@pytest.fixture(scope="module")
def mirrored():
    return tfdist.make_strategy("mirrored", num_devices=4)


def _conv_model():
    keras.utils.set_random_seed(2)
    return keras.Sequential(
        [
            keras.Input((6, 6, 1)),
            keras.layers.Conv2D(4, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(3),
        ]
    )


@pytest.fixture(scope="module")
def case(mirrored):
    x = np.random.default_rng(0).normal(size=(N, 6, 6, 1)).astype("float32")
    reference = _conv_model()  # one device, plain Keras
    expected = reference.predict(x, batch_size=G, verbose=0)
    trainer = tfdist.Trainer(_conv_model, strategy=mirrored, loss="mse")
    trainer.model.set_weights(reference.get_weights())
    return trainer, x, expected


@pytest.mark.parametrize("form", ["array", "x_y_tuple", "dataset", "dataset_fn"])
def test_predict_matches_one_device_in_input_order(case, form):
    trainer, x, expected = case
    y = np.zeros(N, "int32")
    data = {
        "array": x,
        "x_y_tuple": (x, y),
        "dataset": tf.data.Dataset.from_tensor_slices(x).batch(G),
        "dataset_fn": lambda ctx: tf.data.Dataset.from_tensor_slices((x, y)).batch(
            ctx.get_per_replica_batch_size(G)
        ),
    }[form]
    got = trainer.predict(data, global_batch_size=G)
    assert got.shape == expected.shape == (N, 3)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_predict_steps_and_multiple_outputs(mirrored):
    def two_heads():
        inputs = keras.Input((4,))
        return keras.Model(
            inputs, {"a": keras.layers.Dense(2)(inputs), "b": keras.layers.Dense(1)(inputs)}
        )

    trainer = tfdist.Trainer(two_heads, strategy=mirrored, loss={"a": "mse", "b": "mse"})
    x = np.random.default_rng(1).normal(size=(20, 4)).astype("float32")
    got = trainer.predict(x, global_batch_size=8, steps=2)
    expected = trainer.model(x[:16])
    assert got["a"].shape == (16, 2) and got["b"].shape == (16, 1)
    np.testing.assert_allclose(got["a"], expected["a"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["b"], expected["b"], rtol=1e-5, atol=1e-6)


def test_predict_errors(case):
    trainer, x, _ = case
    with pytest.raises(ValueError, match="argument `steps`. Received: steps=0"):
        trainer.predict(x, steps=0)
    with pytest.raises(
        ValueError, match="argument `global_batch_size`. Received: global_batch_size=6"
    ):
        # A dataset_fn batches per replica: 6 does not split over 4.
        trainer.predict(lambda ctx: tf.data.Dataset.from_tensor_slices(x), global_batch_size=6)


def test_predict_takes_any_batch_size(case):
    """6 does not divide by 4 replicas: shares of 2, 2, 1, 1 (the last batch of 2: 1, 1, 0, 0).

    A dataset of such batches, and ``evaluate``: parity row ``predict_evaluate_any_batch_size``.
    """
    trainer, x, expected = case
    got = trainer.predict(x, batch_size=6, verbose=0)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
