"""Parity rows for Keras's built-in callbacks: the same stops, learning rates and weights.

Each ``fit()`` makes fresh callbacks (and fresh temporary directories for those that write), so
plain Keras and the Trainer share none. Files written by the callbacks are compared in
``tests/training/fit/test_callbacks.py``.
"""

import itertools
import os
import tempfile

import keras
import numpy as np
import tensorflow as tf

from tests.keras_parity.parity import SYNC_STRATEGIES, Row
from tests.keras_parity.rows_basic import arrays, mlp, sgd_compile

EPOCHS = 2


def _data():
    x, y, _ = arrays()
    train = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    val = tf.data.Dataset.from_tensor_slices((x[:32], y[:32])).batch(16)
    return train, val


def fitting(make_callbacks, epochs=EPOCHS):
    """A ``Row.fit`` that makes fresh data and ``make_callbacks()`` on every call."""

    def fit():
        train, val = _data()
        return dict(x=train, validation_data=val, epochs=epochs, callbacks=make_callbacks())

    return fit


_CALLS = itertools.count()


def _in_temp(name):
    # Workers of one launch must share the paths (the chief writes, all read a backup): the
    # job names a shared directory; the calls come in the same order on every worker.
    shared = os.environ.get("TFDIST_PARITY_SHARED_DIR")
    if shared:
        directory = os.path.join(shared, str(next(_CALLS)))
        os.makedirs(directory, exist_ok=True)
        return os.path.join(directory, name)
    return os.path.join(tempfile.mkdtemp(prefix="tfdist-parity-"), name)


def ema_compile():
    return dict(sgd_compile(), optimizer=keras.optimizers.SGD(0.1, use_ema=True, ema_momentum=0.5))


def _nan_fit():
    # One NaN feature in the 5th batch: the loss turns NaN there, deterministically on both sides.
    x, y, _ = arrays()
    x[70, 0] = np.nan
    train = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    return dict(x=train, epochs=EPOCHS, callbacks=[keras.callbacks.TerminateOnNaN()])


def _early_stopping():
    # min_delta=1: only epoch 0 improves, so training stops after epoch 1 and restores epoch 0.
    return [
        keras.callbacks.EarlyStopping(
            monitor="val_loss", patience=1, min_delta=1.0, restore_best_weights=True
        )
    ]


class StopAtEpochBegin(keras.callbacks.Callback):
    """Sets ``stop_training`` in ``on_epoch_begin``: Keras still trains one batch of that epoch."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            self.model.stop_training = True


def writers():
    """Callbacks that write files or only watch: the numbers must not move."""
    return [
        keras.callbacks.ModelCheckpoint(_in_temp("model-{epoch}.keras")),
        keras.callbacks.ModelCheckpoint(
            _in_temp("best.weights.h5"), save_weights_only=True, save_best_only=True
        ),
        keras.callbacks.ModelCheckpoint(
            _in_temp("w-{epoch}-{batch}.weights.h5"), save_weights_only=True, save_freq=4
        ),
        keras.callbacks.CSVLogger(_in_temp("log.csv")),
        keras.callbacks.TensorBoard(_in_temp("tb"), update_freq=2, histogram_freq=1),
        keras.callbacks.BackupAndRestore(_in_temp("backup"), save_freq=2),
        keras.callbacks.LambdaCallback(
            on_train_batch_end=lambda batch, logs: None, on_epoch_end=lambda epoch, logs: None
        ),
    ]


ROWS = [
    Row("early_stopping_restore_best", mlp, sgd_compile, fitting(_early_stopping, epochs=4)),
    Row(
        "reduce_lr_on_plateau",
        mlp,
        sgd_compile,
        fitting(
            lambda: [
                keras.callbacks.ReduceLROnPlateau(
                    monitor="loss", factor=0.5, patience=0, min_delta=1.0
                )
            ],
            epochs=3,
        ),
    ),
    Row(
        "learning_rate_scheduler",
        mlp,
        sgd_compile,
        fitting(lambda: [keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.5)]),
    ),
    # Logs reach the callbacks of a parameter-server run up to max_in_flight calls late, so it
    # stops later than Keras: sync strategies only.
    Row("terminate_on_nan", mlp, sgd_compile, _nan_fit, strategies=SYNC_STRATEGIES),
    # The averages are swapped in for validation (the test hooks) and kept at the end of fit.
    Row("swap_ema_weights", mlp, ema_compile, fitting(lambda: [keras.callbacks.SwapEMAWeights()])),
    Row("stop_in_on_epoch_begin", mlp, sgd_compile, fitting(lambda: [StopAtEpochBegin(1)])),
    # ModelCheckpoint, CSVLogger, TensorBoard, BackupAndRestore, LambdaCallback; their files are
    # compared with Keras's in tests/training/fit/test_callbacks.py.
    Row("writers", mlp, sgd_compile, fitting(writers)),
]
