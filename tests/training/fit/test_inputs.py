"""Trainer inputs: exact evaluation for every input kind (against plain Keras), inferred batch
sizes, empty replica batches in training, steps_per_epoch beyond one pass, resuming in tf.data."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.helpers import Crash
from tests.jobs.common import builder, data, initial_weights

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
GLOBAL_BATCH = 16


@pytest.fixture(scope="module")
def mirrored():
    return tfdist.make_strategy("mirrored", num_devices=2)


def _tutorial_dataset_fn(x, y, global_batch_size=GLOBAL_BATCH):
    """The pattern of TF's input tutorial: shard per pipeline, then batch per replica."""

    def dataset_fn(ctx):
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shard(
            ctx.num_input_pipelines, ctx.input_pipeline_id
        )
        return ds.batch(ctx.get_per_replica_batch_size(global_batch_size))

    return dataset_fn


def _trainer(strategy, model=None, **kwargs):
    return tfdist.Trainer(
        model or builder(initial_weights()),
        strategy=strategy,
        optimizer=keras.optimizers.SGD(0.1),
        loss=LOSS,
        metrics=["accuracy"],
        **kwargs,
    )


def _keras_evaluate(strategy, inputs):
    """Plain Keras ``model.evaluate`` under ``strategy``, on a fresh model with the same weights."""
    with strategy.scope():
        model = builder(initial_weights())()
        model.compile("sgd", LOSS, metrics=["accuracy"])
    if isinstance(inputs, tuple):
        return model.evaluate(*inputs, batch_size=GLOBAL_BATCH, verbose=0, return_dict=True)
    if not isinstance(inputs, tf.data.Dataset):
        inputs = strategy.distribute_datasets_from_function(inputs)
    return model.evaluate(inputs, verbose=0, return_dict=True)


@pytest.mark.parametrize(
    "n", [100, 97]
)  # last global batch of 4 (2 per replica), or of 1 (one replica empty)
def test_evaluation_matches_keras_for_every_input_kind(mirrored, n):
    x, y = data(n)
    trainer = _trainer(mirrored)
    exact = trainer.model.evaluate(x, y, batch_size=n, verbose=0, return_dict=True)
    kinds = {
        "arrays": (x, y),
        "dataset": tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH),
        "dataset_fn": _tutorial_dataset_fn(x, y),
    }
    for kind, inputs in kinds.items():
        keras_logs = _keras_evaluate(mirrored, inputs)
        ours = trainer.evaluate(inputs, global_batch_size=GLOBAL_BATCH, return_dict=True)
        for name in ("loss", "accuracy"):
            assert ours[name] == pytest.approx(exact[name], rel=1e-5), (kind, name)
            assert ours[name] == pytest.approx(keras_logs[name], rel=1e-5), (kind, name)
        # The global batch size is not needed: it is read off the data.
        assert trainer.evaluate(inputs, return_dict=True)["loss"] == pytest.approx(
            exact["loss"], rel=1e-5
        ), kind


def test_evaluation_of_a_loaded_dataset_matches_keras(mirrored):
    val = tfdist.data.load(
        "synthetic", split="validation", num_examples=101, input_shape=(6,), num_classes=3
    )
    trainer = _trainer(mirrored)
    x, y = next(iter(val.bind(global_batch_size=101)(None)))
    exact = trainer.model.evaluate(
        x.numpy(), y.numpy(), batch_size=101, verbose=0, return_dict=True
    )
    keras_logs = _keras_evaluate(mirrored, val.bind(global_batch_size=GLOBAL_BATCH))
    ours = trainer.evaluate(val, global_batch_size=GLOBAL_BATCH, return_dict=True)
    for name in ("loss", "accuracy"):
        assert ours[name] == pytest.approx(exact[name], rel=1e-5)
        assert ours[name] == pytest.approx(keras_logs[name], rel=1e-5)
    # Unbound: evaluate takes the batch size the model was trained with.
    trainer.fit((x.numpy(), y.numpy()), global_batch_size=GLOBAL_BATCH, verbose=0)
    after = trainer.model.evaluate(
        x.numpy(), y.numpy(), batch_size=101, verbose=0, return_dict=True
    )
    assert trainer.evaluate(val, return_dict=True)["loss"] == pytest.approx(after["loss"], rel=1e-5)


def test_evaluate_a_dataset_fn_for_some_steps_without_a_global_batch_size(mirrored):
    x, y = data(100)
    trainer = _trainer(mirrored)
    ours = trainer.evaluate(_tutorial_dataset_fn(x, y), steps=3, return_dict=True)
    theirs = trainer.model.evaluate(x[:48], y[:48], batch_size=48, verbose=0, return_dict=True)
    assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-5)


def test_evaluation_steps_beyond_one_pass_are_refused(mirrored):
    x, y = data(100)
    trainer = _trainer(mirrored)
    with pytest.raises(
        ValueError, match=r"argument `steps`. Received: steps=8.*at most 7, the batches in one pass"
    ):
        trainer.evaluate(_tutorial_dataset_fn(x, y), steps=8, return_dict=True)
    with pytest.raises(
        ValueError, match=r"argument `validation_steps`. Received: validation_steps=9.*at most 7"
    ):
        trainer.fit(
            (x, y),
            global_batch_size=GLOBAL_BATCH,
            validation_data=(x, y),
            validation_steps=9,
            verbose=0,
        )


def test_fit_on_a_dataset_fn_without_a_global_batch_size(mirrored):
    # 100 examples: 13 per-replica batches of 8, so the 7th step leaves one replica empty.
    x, y = data(100)
    by_fn = _trainer(mirrored)
    history = by_fn.fit(_tutorial_dataset_fn(x, y), epochs=2, verbose=0)
    assert int(by_fn.model.optimizer.iterations.numpy()) == 14
    by_dataset = _trainer(mirrored)
    by_dataset.fit(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH), epochs=2, verbose=0
    )
    for a, b in zip(by_dataset.model.get_weights(), by_fn.model.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    assert len(history.history["loss"]) == 2


def _cnn():
    keras.utils.set_random_seed(3)
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(4, 3, activation="relu"),
            keras.layers.Conv2D(4, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(10),
        ]
    )


def test_conv_model_trains_on_a_last_global_batch_of_one(mirrored):
    # 33 examples in global batches of 16: the last has one, so one replica's batch is empty,
    # which oneDNN convolutions reject.
    rng = np.random.default_rng(0)
    x = rng.normal(size=(33, 8, 8, 1)).astype("float32")
    y = rng.integers(0, 10, 33).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
    results = {}
    for name, strategy in (
        ("one_device", tfdist.make_strategy("one_device")),
        ("mirrored", mirrored),
    ):
        trainer = _trainer(strategy, model=_cnn)
        history = trainer.fit(dataset, epochs=2, verbose=0)
        assert np.isfinite(history.history["loss"]).all()
        results[name] = (trainer.model.get_weights(), history.history)
    for a, b in zip(results["one_device"][0], results["mirrored"][0]):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    np.testing.assert_allclose(
        results["one_device"][1]["loss"], results["mirrored"][1]["loss"], rtol=1e-5
    )
    np.testing.assert_allclose(
        results["one_device"][1]["accuracy"], results["mirrored"][1]["accuracy"], rtol=1e-6
    )


@pytest.mark.parametrize("kind", ["loaded", "arrays", "dataset_fn"])
def test_steps_per_epoch_longer_than_one_pass(mirrored, kind):
    x, y = data(96)
    inputs = {
        "loaded": tfdist.data.load("synthetic", num_examples=96, input_shape=(6,), num_classes=3),
        "arrays": (x, y),
        "dataset_fn": _tutorial_dataset_fn(x, y),
    }[kind]
    trainer = _trainer(mirrored)
    history = trainer.fit(
        inputs, epochs=2, steps_per_epoch=8, global_batch_size=GLOBAL_BATCH, verbose=0
    )  # 6 a pass
    assert int(trainer.model.optimizer.iterations.numpy()) == 16
    assert len(history.history["loss"]) == 2


def test_resume_with_steps_per_epoch_skips_in_tf_data(mirrored, tmp_path):
    data_fn = tfdist.data.load("synthetic", num_examples=96, input_shape=(6,), num_classes=3)
    kwargs = dict(
        epochs=3, steps_per_epoch=8, global_batch_size=GLOBAL_BATCH, verbose=0
    )  # 6 batches a pass
    reference = _trainer(mirrored)
    reference.fit(data_fn, **kwargs)

    backup_dir = str(tmp_path / "backup")
    first = _trainer(mirrored, backup_dir=backup_dir, backup_freq=3)
    with pytest.raises(RuntimeError, match="simulated crash"):
        first.fit(data_fn, callbacks=[Crash(after=13)], **kwargs)
    resumed = _trainer(mirrored, backup_dir=backup_dir, backup_freq=3)
    batches = []
    counter = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: batches.append(b))
    resumed.fit(data_fn, callbacks=[counter], **kwargs)
    # The backup stood at 12 updates (every 3; the crash came after 13): the resumed fit runs
    # only the 12 left, from epoch 1's batch 4 on.
    assert len(batches) == 12 and batches[:5] == [4, 5, 6, 7, 0], batches
    assert int(resumed.model.optimizer.iterations.numpy()) == 24
    for a, b in zip(reference.model.get_weights(), resumed.model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_an_epoch_of_unknown_length_runs_until_exhausted_counting_each_update(mirrored):
    """``filter`` then ``batch``: 6 batches, the last of 1; calls of 4 updates end mid-call.

    Keras's ``optimizer.iterations`` would be 14: its exhausted call counts one more per epoch
    without moving any weight; the Trainer counts the 12 updates applied.
    """
    from tests.keras_parity.rows_basic import mlp, sgd_compile
    from tests.keras_parity.rows_inputs import unknown_length

    ends = []
    counter = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: ends.append(b))
    trainer = tfdist.Trainer(mlp, strategy=mirrored, steps_per_execution=4, **sgd_compile())
    history = trainer.fit(unknown_length(0, 96), epochs=2, callbacks=[counter], verbose=0)
    assert int(trainer.model.optimizer.iterations.numpy()) == 12
    assert ends == [3, 5] * 2 and len(history.history["loss"]) == 2
    reference = mlp()
    reference.compile(**sgd_compile())
    reference.set_weights(trainer.model.get_weights())
    evaluation = unknown_length(1, 37)
    got = trainer.evaluate(evaluation, return_dict=True, verbose=0)
    want = reference.evaluate(evaluation, return_dict=True, verbose=0)
    assert got == pytest.approx(want, abs=1e-6)
    generator = (batch for batch in unknown_length(1, 37).as_numpy_iterator())
    np.testing.assert_allclose(
        trainer.predict(generator, verbose=0), reference.predict(evaluation, verbose=0), atol=1e-6
    )
