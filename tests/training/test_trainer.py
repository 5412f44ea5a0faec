"""Trainer on one process: accuracy, History, callbacks, precision, exact evaluation, errors."""

import glob
import os

import keras
import numpy as np
import pytest

import tfdist
from tests.jobs.common import builder, data, dataset, initial_weights

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@pytest.fixture(scope="module")
def mirrored():
    return tfdist.make_strategy("mirrored", num_devices=2)


@pytest.fixture(scope="module")
def digits():
    return tfdist.data.load("digits"), tfdist.data.load("digits", split="validation")


def _digits_trainer(strategy, model="cnn", **kwargs):
    keras.utils.set_random_seed(0)
    return tfdist.Trainer(
        lambda: tfdist.models.get(model),
        strategy=strategy,
        optimizer=keras.optimizers.Adam(2e-3),
        loss=LOSS,
        metrics=["accuracy"],
        **kwargs,
    )


def test_mirrored_trains_digits(mirrored, digits):
    train, val = digits
    trainer = _digits_trainer(mirrored)
    history = trainer.fit(train, epochs=6, global_batch_size=64, validation_data=val, verbose=0)
    assert history.history["val_accuracy"][-1] >= 0.95
    assert set(history.history) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert len(history.history["loss"]) == 6
    assert history.history["loss"][-1] < history.history["loss"][0]


def test_history_keys_match_keras_fit(mirrored):
    x, y = data()
    trainer = tfdist.Trainer(
        builder(initial_weights()),
        strategy=mirrored,
        optimizer="sgd",
        loss=LOSS,
        metrics=["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(k=2)],
    )
    ours = trainer.fit((x, y), epochs=2, global_batch_size=16, validation_data=(x, y), verbose=0)
    model = builder(initial_weights())()
    model.compile(
        "sgd", LOSS, metrics=["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(k=2)]
    )
    theirs = model.fit(x, y, batch_size=16, epochs=2, validation_data=(x, y), verbose=0)
    assert sorted(ours.history) == sorted(theirs.history)
    assert isinstance(ours, keras.callbacks.History)


def test_evaluation_counts_each_example_once(digits):
    # 4 replicas, global batch 64: 360 validation examples end in a partial
    # batch and empty top-up batches; the result must equal Keras's on arrays.
    strategy = tfdist.make_strategy("mirrored", num_devices=4)
    train, val = digits
    trainer = _digits_trainer(strategy)
    trainer.fit(train, epochs=1, global_batch_size=64, verbose=0)
    ours = trainer.evaluate(val, global_batch_size=64, return_dict=True)
    x, y = next(iter(val.bind(global_batch_size=val.num_examples)(None)))
    theirs = trainer.model.evaluate(
        x.numpy(), y.numpy(), batch_size=360, verbose=0, return_dict=True
    )
    assert ours["accuracy"] == pytest.approx(theirs["accuracy"], abs=1e-6)
    assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-5)


def test_keras_callbacks(mirrored, tmp_path):
    events = []

    class Recorder(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            events.append((batch, sorted(logs)))

    x, y = data()
    trainer = tfdist.Trainer(
        builder(initial_weights()),
        strategy=mirrored,
        optimizer="sgd",
        loss=LOSS,
        metrics=["accuracy"],
    )
    ckpt = str(tmp_path / "ckpt" / "epoch{epoch}.weights.h5")
    os.makedirs(tmp_path / "ckpt")
    history = trainer.fit(
        (x, y),
        epochs=10,
        global_batch_size=16,
        validation_data=(x, y),
        verbose=0,
        callbacks=[
            Recorder(),
            keras.callbacks.ModelCheckpoint(ckpt, save_weights_only=True),
            keras.callbacks.TensorBoard(str(tmp_path / "tb")),
            keras.callbacks.EarlyStopping(monitor="loss", min_delta=10.0, patience=1),
        ],
    )
    assert len(history.history["loss"]) == 2  # EarlyStopping stopped training
    assert events[0] == (0, ["accuracy", "loss"]) and events[5][0] == 5
    assert len(glob.glob(str(tmp_path / "ckpt" / "*.weights.h5"))) == 2
    assert glob.glob(str(tmp_path / "tb" / "train" / "events.out.tfevents.*"))


def test_steps_per_execution_gives_the_same_weights(mirrored):
    w0 = initial_weights()
    results = []
    for spe in (1, 3):
        trainer = tfdist.Trainer(
            builder(w0),
            strategy=mirrored,
            optimizer=keras.optimizers.SGD(0.1),
            loss=LOSS,
            steps_per_execution=spe,
        )
        trainer.fit(dataset(), epochs=2, verbose=0)
        results.append(trainer.model.get_weights())
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)


def test_objects_created_outside_the_scope_and_the_users_model_after_fit(mirrored):
    # Keras alone fails here ("Mixing different tf.distribute.Strategy objects").
    keras.utils.set_random_seed(3)
    model = builder()()
    before = model.get_weights()
    trainer = tfdist.Trainer(
        model,
        strategy=mirrored,
        optimizer=keras.optimizers.Adam(1e-2),
        loss=LOSS,
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="acc")],
    )
    assert trainer.model is model  # moved into the scope, the same object
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    history = trainer.fit(dataset(), epochs=1, verbose=0)
    assert "acc" in history.history
    # The user's own object is the trained one: its weights moved, and plain Keras predicts
    # with them (outside the scope) what the Trainer predicts.
    assert any(np.abs(a - b).max() > 0 for a, b in zip(before, model.get_weights()))
    x = np.random.default_rng(0).standard_normal((8, *model.input_shape[1:])).astype("float32")
    np.testing.assert_allclose(model.predict(x, verbose=0), trainer.predict(x), atol=1e-6)


@pytest.mark.parametrize("precision", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision(mirrored, digits, precision):
    train, val = digits
    # float16 convolutions are emulated on CPUs (the CNN took 105 s against 6 s in bfloat16
    # here): the MLP exercises the same loss scaling in 18 s.
    model = "mlp" if precision == "mixed_float16" else "cnn"
    trainer = _digits_trainer(mirrored, model=model, precision=precision)
    assert trainer.model.layers[1].compute_dtype == precision.split("_")[1]
    assert all(v.dtype == "float32" for v in trainer.model.trainable_variables)
    if precision == "mixed_float16":
        assert isinstance(trainer.model.optimizer, keras.optimizers.LossScaleOptimizer)
    history = trainer.fit(train, epochs=3, global_batch_size=64, validation_data=val, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert history.history["val_accuracy"][-1] >= 0.85


@pytest.mark.parametrize(
    "kwargs,pattern",
    [
        (
            {"precision": "float8"},
            "argument `precision`. Received: precision='float8'. Expected one of",
        ),
        (
            {"accumulation_steps": 0},
            "argument `accumulation_steps`. Received: accumulation_steps=0",
        ),
        ({"steps_per_execution": -1}, "argument `steps_per_execution`"),
        ({"optimizer": "adamm"}, "argument `optimizer`. Received: optimizer='adamm'"),
    ],
)
def test_constructor_errors(mirrored, kwargs, pattern):
    options = {"optimizer": "sgd", "loss": LOSS, **kwargs}
    with pytest.raises(ValueError, match=pattern.replace("(", r"\(").replace("[", r"\[")):
        tfdist.Trainer(builder(), strategy=mirrored, **options)


def test_model_argument_errors(mirrored):
    with pytest.raises(
        ValueError, match=r"argument `model`. Received: model='cnn'.*tfdist.models.get\('cnn'\)"
    ):
        tfdist.Trainer("cnn", strategy=mirrored, loss=LOSS)
    with pytest.raises(
        ValueError, match="argument `precision`.*dtype policy the model was built with"
    ):
        tfdist.Trainer(builder()(), strategy=mirrored, loss=LOSS, precision="mixed_bfloat16")


def test_fit_data_errors(mirrored, digits):
    train, _ = digits
    trainer = tfdist.Trainer(builder(), strategy=mirrored, optimizer="sgd", loss=LOSS)
    x, y = data()
    with pytest.raises(
        ValueError,
        match=r"argument `global_batch_size`. Received: global_batch_size=15.*"
        r"multiple of the number of replicas in sync \(2\)",
    ):
        trainer.fit((x, y), global_batch_size=15, verbose=0)
    with pytest.raises(
        ValueError, match="argument `steps_per_epoch`. Received: steps_per_epoch=None"
    ):
        trainer.fit(dataset().repeat(), verbose=0)
    with pytest.raises(ValueError, match="argument `global_batch_size`.*yields no batches"):
        trainer.fit(lambda ctx: dataset().take(0), verbose=0)
    with pytest.raises(ValueError, match="argument `x`. Received: x='digits'.*tfdist.data.load"):
        trainer.fit("digits", verbose=0)
    with pytest.raises(ValueError, match="argument `epochs`. Received: epochs=0"):
        trainer.fit(dataset(), epochs=0, verbose=0)
    with pytest.raises(ValueError, match="argument `global_batch_size`.*unbound"):
        trainer.fit(train, verbose=0)
