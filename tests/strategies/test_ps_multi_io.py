"""A multi-input, multi-output model on ParameterServerStrategy, against plain Keras.

One worker runs its steps in order, so the run is deterministic: the final weights, every
history value (per-output losses and metrics, summed per scheduled call by the PS runner)
and evaluate/predict equal plain Keras ``fit`` on one device.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.keras_parity.rows_multi_io import G, N, arrays, dataset, dict_compile, dict_model
from tests.strategies.ps_common import ps_strategy

STEPS = -(-N // G)  # one pass, the last batch partial


@pytest.fixture(scope="module")
def ps():
    return ps_strategy(num_workers=1, num_ps=2)


def _dataset_fn(input_context):
    x, y, w = arrays()
    return (
        tf.data.Dataset.from_tensor_slices((x, y, w))
        .shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        .batch(input_context.get_per_replica_batch_size(G))
    )


@pytest.mark.slow
@pytest.mark.parametrize("data", ["dataset", "dataset_fn"])
def test_ps_matches_keras(ps, data):
    keras.utils.set_random_seed(0)
    model = dict_model()
    model.compile(**dict_compile())
    val = dataset(n=33, seed=1)
    want = model.fit(dataset(weights=True), epochs=2, validation_data=val, verbose=0).history

    keras.utils.set_random_seed(0)
    trainer = tfdist.Trainer(dict_model, strategy=ps, steps_per_execution=2, **dict_compile())
    got = trainer.fit(
        dataset(weights=True) if data == "dataset" else _dataset_fn,
        epochs=2,
        steps_per_epoch=STEPS,
        global_batch_size=G,
        validation_data=val,
        verbose=0,
    ).history
    assert sorted(got) == sorted(want)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], atol=1e-5, rtol=0, err_msg=key)
    for g, w in zip(trainer.model.get_weights(), model.get_weights()):
        np.testing.assert_allclose(g, w, atol=1e-5, rtol=0)

    evaluated = trainer.evaluate(val, return_dict=True)
    assert sorted(evaluated) == sorted(k for k in want if not k.startswith("val_"))
    for key, value in evaluated.items():
        assert value == pytest.approx(want[f"val_{key}"][-1], abs=1e-5), key
    x, _, _ = arrays(33, seed=1)
    predicted, expected = trainer.predict(x), model.predict(x, verbose=0)
    assert isinstance(predicted, dict) and sorted(predicted) == ["cls", "reg"]
    for key in expected:
        np.testing.assert_allclose(predicted[key], expected[key], atol=1e-5, rtol=0)
