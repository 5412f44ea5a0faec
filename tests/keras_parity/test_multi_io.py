"""Multi-input and multi-output models: evaluate, predict and bad input, against plain Keras.

Training parity is in ``rows_multi_io.py`` (run by ``test_parity.py``); here the Trainer's
``evaluate`` and ``predict`` on mirrored x2 give Keras's names, structures and values, with a
last batch of one example (one replica empty), and bad input fails early with one clear error.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.keras_parity.rows_multi_io import (
    arrays,
    dataset,
    dict_compile,
    dict_model,
    list_compile,
    list_model,
)

N_EVAL = 33  # batches of 16, 16 and 1


@pytest.fixture(scope="module")
def mirrored():
    return tfdist.make_strategy("mirrored", num_devices=2)


def _pair(build, compile_kwargs, strategy):
    keras.utils.set_random_seed(0)
    model = build()
    model.compile(**compile_kwargs())
    return model, tfdist.Trainer(build, strategy=strategy, **compile_kwargs())


def _assert_same_structure(got, want):
    assert type(got) is type(want), (type(got), type(want))
    tf.nest.assert_same_structure(got, want)
    for g, w in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
        np.testing.assert_allclose(g, w, atol=1e-5, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dict", "list"])
def test_evaluate_and_predict_match_keras(mirrored, kind):
    lists = kind == "list"
    model, trainer = _pair(
        list_model if lists else dict_model, list_compile if lists else dict_compile, mirrored
    )
    data = dataset(n=N_EVAL, seed=1, lists=lists, weights=True)
    want = model.evaluate(data, return_dict=True, verbose=0)
    got = trainer.evaluate(data, return_dict=True)
    assert sorted(got) == sorted(want)  # loss, cls_loss, reg_loss, cls_accuracy, reg_mae
    for key in want:
        assert got[key] == pytest.approx(want[key], abs=1e-5), key

    x, _, _ = arrays(N_EVAL, seed=1)
    x = [x["a"], x["b"]] if lists else x
    _assert_same_structure(trainer.predict(x), model.predict(x, verbose=0))
    # A dataset of x alone (a 1-tuple, so that a tuple x is not read as (x, y)), batches of 16.
    xs = tf.data.Dataset.from_tensor_slices((tuple(x) if lists else x,)).batch(16)
    _assert_same_structure(trainer.predict(xs), model.predict(xs, verbose=0))


def test_keras_counts_each_batch_once_in_per_output_losses():
    # The Trainer reproduces this (step._track_output_losses); it fails if Keras changes it.
    model = dict_model()
    model.compile(**dict_compile())
    data = dataset(n=N_EVAL, seed=1)  # batches of 16, 16 and 1
    logs = model.evaluate(data, return_dict=True, verbose=0)
    mse = keras.losses.MeanSquaredError()
    per_batch = [float(mse(y["reg"], model.predict_on_batch(x)["reg"])) for x, y in data]
    assert logs["reg_loss"] == pytest.approx(np.mean(per_batch), abs=1e-6)


def _fit_dict(trainer, x):
    _, y, _ = arrays()
    trainer.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), verbose=0)


def test_a_missing_input_key_names_the_argument(mirrored):
    trainer = tfdist.Trainer(dict_model, strategy=mirrored, **dict_compile())
    x, _, _ = arrays()
    with pytest.raises(ValueError, match=r"argument `x`.*keys \['a'\].*Missing: 'b'"):
        _fit_dict(trainer, {"a": x["a"]})
    with pytest.raises(ValueError, match=r"`x`.*x\['b'\] with shape \(None, 4\)"):
        _fit_dict(trainer, {"a": x["a"], "b": x["a"]})
    with pytest.raises(ValueError, match=r"`validation_data`.*Missing: 'b'"):
        trainer.fit(
            dataset(),
            validation_data=tf.data.Dataset.from_tensor_slices(({"a": x["a"]},)).batch(16),
            verbose=0,
        )


def test_a_list_model_fed_one_tensor_is_refused(mirrored):
    trainer = tfdist.Trainer(list_model, strategy=mirrored, **list_compile())
    x, _, _ = arrays()
    # Read as (x, y), as Keras reads it: x is one tensor for two inputs.
    with pytest.raises(ValueError, match=r"`x`.*1 tensor\(s\).*2 tensors.*\(\(a, b\),\)"):
        trainer.predict(tf.data.Dataset.from_tensor_slices((x["a"], x["b"])).batch(16))


@pytest.mark.parametrize("argument", ["loss", "loss_weights", "metrics", "weighted_metrics"])
def test_a_compile_dict_key_that_names_no_output_is_refused(mirrored, argument):
    kwargs = dict_compile()
    kwargs[argument] = {"cls": kwargs["loss"]["cls"] if argument == "loss" else 1.0, "regg": 0.5}
    if "metrics" in argument:
        kwargs[argument] = {"cls": ["accuracy"], "regg": ["mae"]}
    with pytest.raises(ValueError, match=rf"argument `{argument}`.*\['cls', 'reg'\].*'regg'"):
        tfdist.Trainer(dict_model, strategy=mirrored, **kwargs)
