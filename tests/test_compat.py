"""The compat shims: in force where needed, and still needed upstream.

The multi-process proof that upstream Keras still crashes without each shim is
``tests/strategies/test_multi_worker.py::test_upstream_keras_still_needs_the_shim``.
"""
import keras
import numpy as np
import tensorflow as tf

import tfdist
from tfdist import _compat


def test_shims_in_force_for_this_keras():
    applied = _compat.apply()
    if _compat.KERAS_NEEDS_SHIMS:
        assert applied == ["symbolic_build", "multi_worker_reduce", "atomic_assign_add", "sharded_variables"]
        assert _compat.original("symbolic_build") is not None


def test_plain_model_fit_under_mirrored():
    strategy = tfdist.make_strategy("mirrored", num_devices=2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    y = np.arange(64) % 3
    history = model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_keras_still_has_the_private_reduce_hook():
    """`gradients_already_summed` relies on this private Keras method; fails if Keras renames it."""
    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    assert callable(getattr(TFOptimizer, "_all_reduce_sum_gradients", None))


def test_gradients_already_summed_restores_the_optimizer():
    inner = keras.optimizers.SGD()
    opt = keras.optimizers.LossScaleOptimizer(inner)
    with _compat.gradients_already_summed(opt):
        assert inner._all_reduce_sum_gradients([(1, 2)]) == [(1, 2)]
    assert "_all_reduce_sum_gradients" not in vars(inner)
    assert inner._all_reduce_sum_gradients.__func__ is type(inner)._all_reduce_sum_gradients


def test_keras_assign_add_is_still_read_then_write():
    """Fails when Keras makes assign_add atomic: then drop the atomic_assign_add shim."""
    assert _compat.keras_assign_add_is_read_then_write()


def test_atomic_assign_add_keeps_keras_semantics():
    v = keras.Variable(1.0)
    v.assign_add(2.0)
    v.assign_sub(0.5)
    assert float(v.numpy()) == 2.5
    i = keras.Variable(0, dtype="int64")
    i.assign_add(1)
    assert int(i.numpy()) == 1


def test_keras_still_updates_through_extended_update():
    """The sharded_variables shim exists because of this call; fails when Keras changes it."""
    import inspect

    original = _compat.original("sharded_variables")
    assert "distribution.extended.update(" in inspect.getsource(original)
