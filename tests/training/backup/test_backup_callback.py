"""tfdist.callbacks.BackupAndRestore with plain model.fit: step-exact resume."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.helpers import Crash
from tfdist.training.backup.writer import Backup

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _dataset():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 6)).astype("float32")
    y = (x @ rng.normal(size=(6, 3))).argmax(1)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16)  # same order every run


def _model(strategy):
    with strategy.scope():
        keras.utils.set_random_seed(3)
        model = keras.Sequential(
            [keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)]
        )
        model.compile(keras.optimizers.SGD(0.1, momentum=0.9), LOSS)
    return model


def test_plain_fit_resumes_at_the_exact_batch(tmp_path):
    strategy = tfdist.make_strategy("mirrored", num_devices=2)
    reference = _model(strategy)
    reference.fit(_dataset(), epochs=3, verbose=0)

    backup_dir = str(tmp_path / "backup")
    first = _model(strategy)
    with pytest.raises(RuntimeError, match="simulated crash"):
        first.fit(
            _dataset(),
            epochs=3,
            verbose=0,
            callbacks=[tfdist.callbacks.BackupAndRestore(backup_dir, save_freq=5), Crash(after=23)],
        )
    state = Backup(backup_dir, None, is_chief=True).read_state()
    assert (state["epoch"], state["step"], state["updates"]) == (1, 4, 20)

    resumed = _model(strategy)
    history = resumed.fit(
        _dataset(),
        epochs=3,
        verbose=0,
        callbacks=[tfdist.callbacks.BackupAndRestore(backup_dir, save_freq=5)],
    )
    assert len(history.history["loss"]) == 2
    assert int(resumed.optimizer.iterations.numpy()) == 48
    for a, b in zip(reference.get_weights(), resumed.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert not os.path.exists(backup_dir)


class Recorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.begins, self.ends = [], []

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self.begins.append((self.epoch, batch))

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append((self.epoch, batch, sorted(logs or {})))


def test_callbacks_see_only_the_trained_batches_after_a_resume(tmp_path):
    strategy = tfdist.make_strategy("one_device")
    backup_dir = str(tmp_path / "backup")
    with pytest.raises(RuntimeError, match="simulated crash"):
        _model(strategy).fit(
            _dataset(),
            epochs=3,
            verbose=0,
            callbacks=[tfdist.callbacks.BackupAndRestore(backup_dir, save_freq=5), Crash(after=23)],
        )
    # The backup is at epoch 1 (0-based), batch 4 of 16: 12 batches of it remain, then 16 in
    # epoch 2.
    recorder = Recorder()
    model = _model(strategy)
    model.fit(
        _dataset(),
        epochs=3,
        verbose=0,
        callbacks=[tfdist.callbacks.BackupAndRestore(backup_dir, save_freq=5), recorder],
    )
    trained = [(1, b) for b in range(4, 16)] + [(2, b) for b in range(16)]
    assert recorder.begins == trained
    assert [(e, b) for e, b, _ in recorder.ends] == trained  # 28 calls for 28 trained batches
    assert all(keys == ["loss"] for _, _, keys in recorder.ends)
    assert int(model.optimizer.iterations.numpy()) == 48


def test_save_freq_error():
    with pytest.raises(ValueError, match="argument `save_freq`. Received: save_freq='batch'"):
        tfdist.callbacks.BackupAndRestore("/tmp/x", save_freq="batch")
