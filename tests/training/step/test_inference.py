"""The evaluation and prediction steps (tfdist/training/step/inference.py), mirrored x2."""

import keras
import numpy as np

import tfdist
from tests.training.zero.test_per_layer import Counts

G = 12
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _counting(weights=None):
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, activation="tanh"),
            Counts(),
            keras.layers.Dense(3),
        ]
    )
    if weights is not None:
        model.set_weights(weights)
    return model


def test_validation_runs_a_counter_as_keras_evaluate_under_mirrored():
    # The counter's assign_add is a merge_call in the forward, which TF refuses inside a cond's
    # branch. The last validation batch (1 example) leaves one replica an empty batch; Keras
    # runs the forward on it too, and its loss and metrics count nothing.
    weights = _counting().get_weights()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(37, 6)).astype("float32")
    y = rng.integers(0, 3, size=(37,)).astype("int32")
    fit = dict(batch_size=G, epochs=1, shuffle=False, verbose=0, validation_data=(x[24:], y[24:]))
    trainer = tfdist.Trainer(
        lambda: _counting(weights),
        strategy=tfdist.make_strategy("mirrored", num_devices=2),
        optimizer=keras.optimizers.SGD(0.1),
        loss=LOSS,
        metrics=["accuracy"],
    )
    mine = trainer.fit(x[:24], y[:24], **fit).history
    with tfdist.make_strategy("mirrored", num_devices=2).scope():
        keras_model = _counting(weights)
        keras_model.compile(optimizer=keras.optimizers.SGD(0.1), loss=LOSS, metrics=["accuracy"])
    theirs = keras_model.fit(x[:24], y[:24], **fit).history
    assert mine.keys() == theirs.keys() and "val_loss" in mine
    assert all(abs(mine[k][-1] - theirs[k][-1]) <= 1e-5 for k in mine), (mine, theirs)
    # predict's forward too (13 examples: the last batch's second replica empty again).
    got = trainer.predict(x[24:], batch_size=G, verbose=0)
    want = keras_model.predict(x[24:], batch_size=G, verbose=0)
    np.testing.assert_allclose(got, want, atol=1e-5)
    count = int(trainer.model.layers[1].count.numpy())
    assert count == int(keras_model.layers[1].count.numpy()) and count > 0
