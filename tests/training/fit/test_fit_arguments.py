"""Keras's ``fit`` arguments where parity rows cannot look: shuffling, warnings, return shapes.

The numbers of each argument against plain Keras are in ``tests/keras_parity``
(``rows_fit_arguments.py``); refusals are rows of ``tests/test_bad_inputs.py``.
"""

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.data.batch_sizes import default_input_context
from tfdist.data.inputs import Reading, as_input
from tfdist.training.fit import keras_data as fit_data

N = 40


def _epochs(shuffle, epochs=2, batch=8):
    """The x values of each epoch of training arrays 0..N-1, as the Trainer would read them."""
    x = np.arange(N, dtype="float32")
    source = as_input(
        (x, x.astype("int32")),
        Reading(training=True, shuffle=shuffle),
        input_context=default_input_context(),
        global_batch_size=batch,
    )
    return [[b[0].numpy().tolist() for b in source.dataset] for _ in range(epochs)]


def test_shuffle_true_visits_every_example_once_per_epoch_in_a_new_order():
    first, second = (sum(batches, []) for batches in _epochs(True))
    assert sorted(first) == sorted(second) == list(range(N))
    assert first != second and first != list(range(N))


def test_shuffle_false_keeps_the_order_and_batch_shuffles_inside_batches():
    assert sum(_epochs(False, epochs=1)[0], []) == list(range(N))
    batches = _epochs("batch", epochs=1)[0]
    assert [sorted(b) for b in batches] == [list(range(i, i + 8)) for i in range(0, N, 8)]
    assert sum(batches, []) != list(range(N))


def test_nested_arrays_batch_per_input_and_output():
    x = {"a": np.zeros((10, 3), "float32"), "b": np.ones((10, 2), "float32")}
    y = [np.zeros((10,), "int32"), np.zeros((10, 1), "float32")]
    source = as_input(
        fit_data.keras_data(x, y, np.ones((10,), "float32")),
        Reading(training=False),
        input_context=default_input_context(),
        global_batch_size=4,
    )
    xs, ys, ws = source.element_spec
    assert xs["a"].shape.as_list() == [None, 3] and xs["b"].shape.as_list() == [None, 2]
    assert len(ys) == 2 and len(ws) == 2  # one sample_weight array weighs every output
    assert source.steps_per_epoch == 3


def test_shuffle_is_ignored_with_a_warning_for_a_dataset(caplog):
    ds = tf.data.Dataset.from_tensor_slices(np.zeros((4, 2))).batch(2)
    with caplog.at_level(logging.WARNING, logger=fit_data.__name__):
        fit_data.warn_unused_shuffle(ds, True)
        fit_data.warn_unused_shuffle(ds, False)
    assert len(caplog.records) == 1
    assert "shuffle=True is ignored: x is a tf.data.Dataset" in caplog.text


@pytest.mark.slow
def test_evaluate_returns_what_keras_evaluate_returns():
    strategy = tfdist.make_strategy("mirrored", num_devices=2)
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).standard_normal((N, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    trainer = tfdist.Trainer(
        lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]),
        strategy=strategy,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    ours = trainer.evaluate(x, y, batch_size=8, verbose=0)
    theirs = trainer.model.evaluate(x, y, batch_size=8, verbose=0)
    assert isinstance(ours, list) and len(ours) == 2
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    logs = trainer.evaluate(x, y, global_batch_size=8, verbose=0, return_dict=True)
    assert logs == pytest.approx({"loss": theirs[0], "accuracy": theirs[1]}, rel=1e-5)
    assert trainer.predict(x, batch_size=8, verbose=0).shape == (N, 2)
