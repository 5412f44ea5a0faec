"""ParameterServerStrategy through the same Trainer, on an in-process loopback cluster."""

import json

import keras
import numpy as np
import pytest

import tfdist
from tests.jobs.common import builder, dataset, initial_weights
from tests.strategies.ps_common import loss_tracker, ps_strategy

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
G = 64


@pytest.fixture(scope="module")
def ps():
    return ps_strategy(num_workers=2, num_ps=1)


@pytest.fixture(scope="module")
def digits():
    return tfdist.data.load("digits"), tfdist.data.load("digits", split="validation")


def _trainer(strategy, model="cnn", **kwargs):
    keras.utils.set_random_seed(0)
    options = {
        "optimizer": keras.optimizers.Adam(2e-3),
        "loss": LOSS,
        "metrics": ["accuracy"],
        **kwargs,
    }
    return tfdist.Trainer(lambda: tfdist.models.get(model), strategy=strategy, **options)


def test_ps_trains_digits(ps, digits):
    train, val = digits
    trainer = _trainer(ps)
    history = trainer.fit(
        train, epochs=4, steps_per_epoch=25, global_batch_size=G, validation_data=val, verbose=0
    )
    assert history.history["val_accuracy"][-1] >= 0.9
    assert set(history.history) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert int(trainer.model.optimizer.iterations.numpy()) == 100
    kernel = trainer.model.trainable_variables[0].value
    assert "/job:ps" in kernel.device  # the variables live on the parameter server


def test_step_counter_is_exact_under_concurrent_workers(ps):
    # Keras's read-then-write assign_add lost increments here (200 scheduled, 167 counted).
    trainer = tfdist.Trainer(
        builder(initial_weights()), strategy=ps, optimizer=keras.optimizers.SGD(0.05), loss=LOSS
    )
    fn = lambda ctx: dataset(96, 16)  # noqa: E731 - a plain dataset_fn(input_context)
    trainer.fit(fn, epochs=2, steps_per_epoch=100, global_batch_size=16, verbose=0)
    assert int(trainer.model.optimizer.iterations.numpy()) == 200
    # Reset each epoch; no lost adds.
    assert float(loss_tracker(trainer.model).count.numpy()) == 100 * 16


def test_batch_callbacks_receive_fetched_logs(ps):
    seen = []

    class Recorder(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append((batch, logs))

    trainer = tfdist.Trainer(
        builder(initial_weights()),
        strategy=ps,
        optimizer="sgd",
        loss=LOSS,
        metrics=["accuracy"],
        steps_per_execution=5,
    )
    trainer.fit(
        lambda ctx: dataset(96, 16),
        epochs=1,
        steps_per_epoch=40,
        global_batch_size=16,
        callbacks=[Recorder()],
        verbose=0,
    )
    assert [b for b, _ in seen] == [
        4,
        9,
        14,
        19,
        24,
        29,
        34,
        39,
    ]  # one per scheduled execution, in order
    for _, logs in seen:
        assert set(logs) == {"loss", "accuracy"}
        assert all(isinstance(v, float) and np.isfinite(v) for v in logs.values())


def test_validation_counts_each_example_once(ps, digits):
    train, val = digits
    trainer = _trainer(ps)
    trainer.fit(train, epochs=1, steps_per_epoch=10, global_batch_size=G, verbose=0)
    ours = trainer.evaluate(val, global_batch_size=G, return_dict=True)
    x, y = next(iter(val.bind(global_batch_size=val.num_examples)(None)))
    theirs = {
        "loss": float(LOSS(y, trainer.model(x))),
        "accuracy": float(np.mean(np.argmax(trainer.model(x), 1) == y.numpy())),
    }
    assert ours["accuracy"] == pytest.approx(theirs["accuracy"], abs=1e-6)
    assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-5)
    assert float(loss_tracker(trainer.model).count.numpy()) == 360


@pytest.mark.parametrize("precision", ["mixed_bfloat16", "mixed_float16"])
def test_accumulation_and_precision(ps, digits, precision):
    train, val = digits
    # float16 convolutions are emulated on CPUs (about 10x the CNN's bfloat16 time): the MLP
    # exercises the same loss scaling.
    model = "mlp" if precision == "mixed_float16" else "cnn"
    trainer = _trainer(ps, model=model, precision=precision, accumulation_steps=2)
    history = trainer.fit(
        train, epochs=2, steps_per_epoch=20, global_batch_size=G, validation_data=val, verbose=0
    )
    assert int(trainer.model.optimizer.iterations.numpy()) == 20  # updates, not micro-batches
    assert history.history["updates"] == [10, 20]
    assert np.isfinite(history.history["loss"]).all()
    if precision == "mixed_float16":
        assert history.history["skipped_updates"][-1] == 0 and history.history["loss_scale"][-1] > 1


def test_sharded_variables(digits, tmp_path):
    strategy = ps_strategy(num_workers=2, num_ps=2, min_shard_bytes=4096)
    train, val = digits
    trainer = tfdist.Trainer(
        lambda: tfdist.models.get("mlp", hidden_units=(64, 64)),
        strategy=strategy,
        optimizer="adam",
        loss=LOSS,
        metrics=["accuracy"],
    )
    kernel = next(v for v in trainer.model.trainable_variables if v.shape == (64, 64)).value
    assert type(kernel).__name__ == "ShardedVariable"
    assert {v.device.split("/task:")[1][0] for v in kernel.variables} == {
        "0",
        "1",
    }  # on both ps tasks
    history = trainer.fit(
        train, epochs=3, steps_per_epoch=20, global_batch_size=G, validation_data=val, verbose=0
    )
    assert history.history["val_accuracy"][-1] >= 0.8
    path = str(tmp_path / "sharded.weights.h5")
    trainer.model.save_weights(path)
    fresh = tfdist.models.get("mlp", hidden_units=(64, 64))
    fresh.load_weights(path)
    for a, b in zip(trainer.model.get_weights(), fresh.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_ps_errors(ps, monkeypatch):
    trainer = tfdist.Trainer(builder(), strategy=ps, optimizer="sgd", loss=LOSS)
    with pytest.raises(
        ValueError,
        match="argument `steps_per_epoch`. Received: steps_per_epoch=None. "
        "Expected a positive integer under strategy 'parameter_server'",
    ):
        trainer.fit(tfdist.data.load("digits"), global_batch_size=G, verbose=0)
    with pytest.raises(ValueError, match="argument `num_workers`. Received: num_workers=0"):
        tfdist.make_strategy("parameter_server", num_workers=0)
    with pytest.raises(
        ValueError, match="argument `allow_late_connect`. Received: allow_late_connect='yes'"
    ):
        tfdist.make_strategy("parameter_server", allow_late_connect="yes")
    monkeypatch.setenv(
        "TF_CONFIG",
        json.dumps(
            {
                "cluster": {
                    "worker": ["127.0.0.1:1"],
                    "ps": ["127.0.0.1:2"],
                    "chief": ["127.0.0.1:3"],
                },
                "task": {"type": "chief", "index": 0},
            }
        ),
    )
    with pytest.raises(
        ValueError,
        match="argument `num_workers`. Received: num_workers=2. Expected None when "
        "TF_CONFIG describes the cluster",
    ):
        tfdist.make_strategy("parameter_server", num_workers=2)
    monkeypatch.setenv(
        "TF_CONFIG",
        json.dumps(
            {"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 0}}
        ),
    )
    with pytest.raises(ValueError, match="argument `TF_CONFIG.cluster`.*a cluster with ps tasks"):
        tfdist.make_strategy("parameter_server")


def test_predict_on_the_coordinator_in_input_order(ps):
    weights = initial_weights()
    trainer = tfdist.Trainer(builder(weights), strategy=ps, optimizer="sgd", loss=LOSS)
    x = np.random.default_rng(5).normal(size=(50, 6)).astype("float32")  # a partial last batch of 2
    expected = builder(weights)().predict(x, batch_size=16, verbose=0)
    np.testing.assert_allclose(
        trainer.predict(x, global_batch_size=16), expected, rtol=1e-5, atol=1e-6
    )


@pytest.mark.slow
def test_keras_fit_arguments_on_arrays(ps):
    # Arrays are read whole by every worker (repeated); the split happens before, on the arrays.
    weights = initial_weights()
    trainer = tfdist.Trainer(builder(weights), strategy=ps, optimizer="sgd", loss=LOSS)
    rng = np.random.default_rng(6)
    x = rng.normal(size=(64, 6)).astype("float32")
    y = rng.integers(0, 2, size=64).astype("int32")
    history = trainer.fit(
        x,
        y,
        batch_size=16,
        epochs=2,
        steps_per_epoch=3,
        validation_split=0.25,
        validation_freq=2,
        class_weight={0: 1.0, 1: 2.0},
        verbose=0,
    )
    assert len(history.history["loss"]) == 2 and len(history.history["val_loss"]) == 1
    assert int(trainer.model.optimizer.iterations.numpy()) == 6
    # The held-out last quarter, evaluated after the last epoch.
    expected = float(LOSS(y[48:], trainer.model(x[48:])))
    assert history.history["val_loss"][0] == pytest.approx(expected, rel=1e-5)


def test_keras_callbacks_on_the_coordinator(ps, tmp_path):
    """EarlyStopping, ReduceLROnPlateau, SwapEMAWeights, ModelCheckpoint and CSVLogger on PS.

    Asynchronous updates make the numbers differ from one-device Keras; the behaviour is checked:
    the stop, the restored weights, the new learning rate on the PS variables, the files.
    """
    snapshots = []
    trainer = tfdist.Trainer(
        builder(initial_weights()),
        strategy=ps,
        optimizer=keras.optimizers.SGD(0.1, use_ema=True),
        loss=LOSS,
        metrics=["accuracy"],
    )
    # min_delta=1: only epoch 0 improves, so both act at the end of epoch 1.
    callbacks = [
        keras.callbacks.LambdaCallback(
            on_epoch_end=lambda epoch, logs: snapshots.append(trainer.model.get_weights())
        ),
        keras.callbacks.EarlyStopping(patience=1, min_delta=1.0, restore_best_weights=True),
        keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0, min_delta=1.0),
        keras.callbacks.SwapEMAWeights(),
        keras.callbacks.ModelCheckpoint(
            str(tmp_path / "w-{epoch}.weights.h5"), save_weights_only=True
        ),
        keras.callbacks.CSVLogger(str(tmp_path / "log.csv")),
    ]
    history = trainer.fit(
        lambda ctx: dataset(96, 16),
        epochs=4,
        steps_per_epoch=6,
        global_batch_size=16,
        validation_data=dataset(32, 16),
        callbacks=callbacks,
        verbose=0,
    )
    # Keras logs the rate each epoch trained with, then lowers it for the next.
    assert history.history["learning_rate"] == pytest.approx([0.1, 0.1])
    assert float(trainer.model.optimizer.learning_rate.numpy()) == pytest.approx(0.05)
    for got, want in zip(trainer.model.get_weights(), snapshots[0]):
        np.testing.assert_array_equal(got, want)  # EarlyStopping restored epoch 0's weights
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "log.csv",
        "w-1.weights.h5",
        "w-2.weights.h5",
    ]
    assert len((tmp_path / "log.csv").read_text().splitlines()) == 3
