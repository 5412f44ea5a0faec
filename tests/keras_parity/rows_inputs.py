"""Parity rows for the inputs Keras's ``fit`` takes besides arrays and datasets of known length.

A Python generator (with ``steps_per_epoch``, and as ``validation_data``, with and without
``validation_steps``), a
``keras.utils.PyDataset`` (read by threads, and by processes, its ``on_epoch_begin`` and
``on_epoch_end`` called), a dataset of unknown length (``filter`` then ``batch``: each epoch runs
until it is exhausted), and a model whose only loss is ``add_loss``, fit without ``y``.

Each ``fit()`` makes a fresh generator or ``PyDataset``, so both sides read the same batches.
Rows leave out parameter_server where the Trainer refuses the input there: a generator or a
``PyDataset`` cannot be read by the parameter-server workers (other processes), and an epoch of
unknown length needs ``steps_per_epoch`` there (see ``test_bad_inputs.py``).
"""

import time

import keras
import numpy as np
import tensorflow as tf

from tests.keras_parity.parity import Row, fixed_weights
from tests.keras_parity.rows_basic import FEATURES, arrays, mlp, sgd_compile

BATCH = 16


def batches(x, y):
    for i in range(0, len(x), BATCH):
        yield x[i : i + BATCH], y[i : i + BATCH]


def endless(x, y):
    while True:
        yield from batches(x, y)


def generator_steps_per_epoch_validation():
    x, y, _ = arrays()
    vx, vy, _ = arrays(seed=1, n=37)  # 3 batches, the last of 5
    # 3 steps of the 6 batches per epoch: epoch 2 goes on where epoch 1 stopped, as in Keras.
    # Validation runs until the generator is exhausted; epoch 2's reads only the 2 batches
    # peeked for the spec, chained in front again, as in Keras.
    return dict(x=endless(x, y), steps_per_epoch=3, validation_data=batches(vx, vy), epochs=2)


class PauseAfterValidationBatches(keras.callbacks.Callback):
    """A pause after each validation batch, so the generator refills Keras's prefetch buffer.

    ``prefetch(AUTOTUNE)`` starts one batch deep and doubles its depth when the model finds it
    empty, so how many batches Keras reads ahead (and loses with each validation's iterator)
    depends on timing. With the pause it stays one batch deep, as it usually is.
    """

    def on_test_batch_end(self, batch, logs=None):
        time.sleep(0.03)


def generator_validation_steps():
    x, y, _ = arrays()
    vx, vy, _ = arrays(seed=1)  # a cycle of 6 batches
    # 4 of them per validation: the 2 peeked for the spec, chained in front again each time,
    # then the cycle goes on, one batch past the last validation's (Keras's read-ahead): the
    # second epoch validates batches 0, 1, 5, 0; the first and third 0, 1, 2, 3.
    return dict(
        x=x,
        y=y,
        batch_size=BATCH,
        epochs=3,
        shuffle=False,
        validation_data=endless(vx, vy),
        validation_steps=4,
        callbacks=[PauseAfterValidationBatches()],
    )


class Batches(keras.utils.PyDataset):
    """6 batches of 16; ``on_epoch_end`` rolls their order, so its calls change the numbers."""

    def __init__(self, seed=0, n=96, rolls=True, **kwargs):
        super().__init__(**kwargs)
        self.x, self.y, _ = arrays(seed=seed, n=n)
        self.order = np.arange(len(self))
        self.rolls = rolls

    def __len__(self):
        return -(-len(self.x) // BATCH)

    def __getitem__(self, index):
        i = self.order[index] * BATCH
        return self.x[i : i + BATCH], self.y[i : i + BATCH]

    def on_epoch_end(self):
        if self.rolls:
            self.order = np.roll(self.order, 1)


def py_dataset_threads():
    return dict(
        x=Batches(workers=2, max_queue_size=3),
        validation_data=Batches(seed=1, n=37),
        epochs=2,
        shuffle=False,
    )


def py_dataset_processes_steps_per_epoch():
    # Hooks that change nothing: with steps_per_epoch both sides read ahead of them.
    return dict(
        x=Batches(rolls=False, workers=2, use_multiprocessing=True),
        steps_per_epoch=3,
        epochs=2,
        shuffle=False,
    )


def unknown_length(seed, n):
    x, y, _ = arrays(seed=seed, n=n)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda a, b: a[2] > -1.1)
    # 81 of 96 examples: 6 batches, the last of 1, so one replica (and on multi_worker one
    # worker) has no example in the last step, and must still stop with the others.
    return ds.batch(BATCH)


def dataset_unknown_length():
    return dict(x=unknown_length(0, 96), validation_data=unknown_length(1, 37), epochs=2)


class AddedLoss(keras.layers.Layer):
    """An autoencoder's reconstruction loss, added with ``add_loss``."""

    def call(self, inputs):
        x, reconstruction = inputs
        self.add_loss(tf.reduce_mean(tf.square(x - reconstruction)))
        return reconstruction


def autoencoder():
    inputs = keras.Input((FEATURES,))
    hidden = keras.layers.Dense(3, activation="relu")(inputs)
    outputs = AddedLoss()([inputs, keras.layers.Dense(FEATURES)(hidden)])
    return fixed_weights(keras.Model(inputs, outputs))


def no_loss_compile():
    return dict(optimizer=keras.optimizers.SGD(0.1))


def add_loss_x_only():
    x, _, _ = arrays()
    vx, _, _ = arrays(seed=1, n=37)  # validation: a generator of (x,) batches, the last of 5
    batches_of_x = ((vx[i : i + BATCH],) for i in range(0, len(vx), BATCH))
    return dict(x=x, batch_size=BATCH, epochs=2, shuffle=False, validation_data=batches_of_x)


def add_loss_dataset_of_x():
    x, _, _ = arrays(n=101)  # a partial last batch of 5
    return dict(x=tf.data.Dataset.from_tensor_slices(x).batch(BATCH), epochs=2)


SYNC = ("mirrored", "multi_worker")
ROWS = [
    Row(
        "generator_steps_per_epoch_validation",
        mlp,
        sgd_compile,
        generator_steps_per_epoch_validation,
        strategies=SYNC,
    ),
    # Training on arrays: parameter_server evaluates the generator on its coordinator.
    Row("generator_validation_steps", mlp, sgd_compile, generator_validation_steps),
    Row("py_dataset_threads", mlp, sgd_compile, py_dataset_threads, strategies=SYNC),
    Row(
        "py_dataset_processes_steps_per_epoch",
        mlp,
        sgd_compile,
        py_dataset_processes_steps_per_epoch,
        strategies=SYNC,
    ),
    Row("dataset_unknown_length", mlp, sgd_compile, dataset_unknown_length, strategies=SYNC),
    # Arrays without y; validation from a generator (on parameter_server: on the coordinator).
    Row("add_loss_x_only", autoencoder, no_loss_compile, add_loss_x_only),
    # A dataset of x alone: only the packing differs from the row above, so mirrored is enough.
    Row(
        "add_loss_dataset_of_x",
        autoencoder,
        no_loss_compile,
        add_loss_dataset_of_x,
        strategies=("mirrored",),
    ),
]
