"""Parity rows for Keras's ``fit`` arguments: arrays with ``y``, weights, validation, nested data.

Every row uses SGD and ``shuffle=False`` (or a dataset), so both sides see the same batches.
"""

import keras
import numpy as np
import tensorflow as tf

from tests.keras_parity.parity import Row
from tests.keras_parity.rows_basic import FEATURES, arrays, mlp, sgd_compile


def fit_with(**extra):
    def fit():
        x, y, _ = arrays()
        return {**dict(x=x, y=y, batch_size=16, epochs=2, shuffle=False), **extra}

    return fit


def sample_weighted():
    x, y, w = arrays()
    return dict(x=x, y=y, sample_weight=w, batch_size=16, epochs=2, shuffle=False)


def class_weighted_dataset():
    x, y, _ = arrays()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    return dict(x=ds, epochs=2, class_weight={0: 0.5, 2: 3.0})


def validation_arrays():
    x, y, _ = arrays()
    xv, yv, _ = arrays(seed=1)
    return dict(
        x=x, y=y, batch_size=16, epochs=2, shuffle=False, validation_data=(xv[:40], yv[:40])
    )


def two_inputs():
    keras.utils.set_random_seed(1)
    a, b = keras.Input((4,), name="a"), keras.Input((2,), name="b")
    hidden = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()([a, b]))
    return keras.Model({"a": a, "b": b}, keras.layers.Dense(3)(hidden))


def dict_inputs():
    x, y, _ = arrays()
    return dict(x={"a": x[:, :4], "b": x[:, 4:]}, y=y, batch_size=16, epochs=2, shuffle=False)


def two_outputs():
    keras.utils.set_random_seed(1)
    inputs = keras.Input((FEATURES,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    outputs = {
        "cls": keras.layers.Dense(3, name="cls")(hidden),
        "reg": keras.layers.Dense(1, name="reg")(hidden),
    }
    return keras.Model(inputs, outputs)


def two_outputs_compile():
    return dict(
        optimizer=keras.optimizers.SGD(0.1),
        loss={"cls": keras.losses.SparseCategoricalCrossentropy(from_logits=True), "reg": "mse"},
        loss_weights={"cls": 1.0, "reg": 0.5},
        metrics={"cls": ["accuracy"]},
    )


def dict_outputs():
    x, y, w = arrays()
    targets = {"cls": y, "reg": x[:, :1] * 0.5}
    weights = {"cls": w, "reg": np.ones_like(w)}
    return dict(x=x, y=targets, sample_weight=weights, batch_size=16, epochs=2, shuffle=False)


MIRRORED = ("mirrored",)
ROWS = [
    Row("arrays_batch_size", mlp, sgd_compile, fit_with(), strategies=MIRRORED),
    Row(  # no batch_size: Keras's ceil(96 / 4) = 24 per step
        "arrays_steps_per_epoch",
        mlp,
        sgd_compile,
        fit_with(batch_size=None, steps_per_epoch=4),
        strategies=MIRRORED,
    ),
    Row("arrays_sample_weight", mlp, sgd_compile, sample_weighted, strategies=MIRRORED),
    Row(
        "arrays_class_weight",
        mlp,
        sgd_compile,
        fit_with(class_weight={0: 2.0, 1: 0.5}),
        strategies=MIRRORED,
    ),
    Row("dataset_class_weight", mlp, sgd_compile, class_weighted_dataset, strategies=MIRRORED),
    # One row for the three: the last quarter held out, validated after epoch 2 only, by 8s.
    Row(
        "arrays_validation_split_freq_batch_size",
        mlp,
        sgd_compile,
        fit_with(validation_split=0.25, validation_freq=2, validation_batch_size=8, epochs=3),
        strategies=MIRRORED,
        slow=True,
    ),
    Row("arrays_validation_data", mlp, sgd_compile, validation_arrays, strategies=MIRRORED),
    Row("arrays_dict_inputs", two_inputs, sgd_compile, dict_inputs, strategies=MIRRORED),
    Row(
        "arrays_dict_outputs_sample_weight",
        two_outputs,
        two_outputs_compile,
        dict_outputs,
        strategies=MIRRORED,
    ),
]
