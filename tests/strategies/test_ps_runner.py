"""The PS runner's contract with the loop.

Failures leave the strategy usable, data inputs train, running logs are true.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.jobs.common import builder, dataset, initial_weights
from tests.jobs.common import data as arrays
from tests.strategies.ps_common import loss_tracker, ps_strategy

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@pytest.fixture(scope="module")
def ps():
    return ps_strategy(num_workers=2, num_ps=1)


def _fit(strategy, data, steps=6, **kwargs):
    trainer = tfdist.Trainer(
        builder(initial_weights()), strategy=strategy, optimizer="sgd", loss=LOSS, **kwargs
    )
    return trainer, trainer.fit(
        data, epochs=1, steps_per_epoch=steps, global_batch_size=16, verbose=0
    )


def test_a_failed_fit_leaves_the_strategy_usable(ps):
    x, y = (
        np.zeros((32, 6), "float32"),
        np.full((32,), 7, "int32"),
    )  # label 7 of 3 classes: fails on the worker
    bad = lambda ctx: tf.data.Dataset.from_tensor_slices((x, y)).batch(16)  # noqa: E731
    good = lambda ctx: dataset(96, 16)  # noqa: E731
    trainer, _ = _fit(ps, good)
    assert int(trainer.model.optimizer.iterations.numpy()) == 6
    with pytest.raises(tf.errors.InvalidArgumentError, match="label value of 7"):
        _fit(ps, bad)
    for _ in range(2):  # the next fits do not inherit the failure
        trainer, _ = _fit(ps, good)
        assert int(trainer.model.optimizer.iterations.numpy()) == 6


@pytest.mark.parametrize("form", ["dataset", "arrays"])
def test_datasets_and_arrays_train_under_ps(ps, form):
    data = dataset(96, 16) if form == "dataset" else arrays(96)
    trainer, history = _fit(ps, data, steps=12, metrics=["accuracy"])
    assert int(trainer.model.optimizer.iterations.numpy()) == 12
    assert np.isfinite(history.history["loss"]).all()


def _classifier():
    x, y = arrays(16)
    top2 = keras.metrics.SparseTopKCategoricalAccuracy(k=2)
    options = {"optimizer": keras.optimizers.SGD(0.0), "loss": LOSS, "metrics": ["accuracy", top2]}

    def expected(model):
        logits = model(x)
        return {
            "loss": float(LOSS(y, logits)),
            "accuracy": float(np.mean(np.argmax(logits, 1) == y)),
            "sparse_top_k_categorical_accuracy": float(
                keras.metrics.SparseTopKCategoricalAccuracy(k=2)(y, logits)
            ),
        }

    return builder(initial_weights()), (x, y), options, expected


def _embedding():
    # The reported case: an embedding model, RMSprop, binary_accuracy (logged 1.2812 before).
    x = np.random.default_rng(0).integers(0, 50, (16, 5)).astype("int32")
    y = (x[:, :1] > 25).astype("float32")
    loss = keras.losses.BinaryCrossentropy(from_logits=True)
    options = {
        "optimizer": keras.optimizers.RMSprop(0.0),
        "loss": loss,
        "metrics": [keras.metrics.BinaryAccuracy(threshold=0.0)],
    }

    def build():
        keras.utils.set_random_seed(2)
        return keras.Sequential(
            [
                keras.Input((5,), dtype="int32"),
                keras.layers.Embedding(50, 8),
                keras.layers.GlobalAveragePooling1D(),
                keras.layers.Dense(1),
            ]
        )

    def expected(model):
        logits = model(x)
        return {
            "loss": float(loss(y, logits)),
            "binary_accuracy": float(np.mean((np.asarray(logits) > 0) == (y > 0.5))),
        }

    return build, (x, y), options, expected


@pytest.mark.parametrize(
    "case, steps_per_execution, accumulation_steps",
    [(_classifier, 1, 1), (_classifier, 20, 1), (_classifier, 4, 2), (_embedding, 1, 1)],
    ids=["classifier", "20_per_execution", "accumulation", "embedding_rmsprop"],
)
def test_every_logged_value_is_a_true_running_mean(
    ps, case, steps_per_execution, accumulation_steps
):
    """Mid-epoch logs are read while other steps run; they must still be exact running means.

    With a learning rate of 0 and one repeated batch every finished step has
    the same loss and metrics, so every running mean equals them exactly; a
    torn read (a metric's total updated by a step whose count is not yet in)
    shows up as a different value (e.g. accuracy 1.28).
    """
    build, batch, options, expected_of = case()
    seen = []

    class Recorder(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(dict(logs))

    trainer = tfdist.Trainer(
        build,
        strategy=ps,
        steps_per_execution=steps_per_execution,
        accumulation_steps=accumulation_steps,
        **options,
    )
    history = trainer.fit(
        lambda ctx: tf.data.Dataset.from_tensors(batch),
        epochs=2,
        steps_per_epoch=60,
        global_batch_size=16,
        callbacks=[Recorder()],
        verbose=0,
    )
    expected = expected_of(trainer.model)
    assert len(seen) == 120 // steps_per_execution
    for logs in seen + [{k: v[-1] for k, v in history.history.items()}]:
        logs.pop("updates", None)
        assert set(logs) == set(expected)
        for name, value in expected.items():
            assert logs[name] == pytest.approx(value, rel=1e-5, abs=1e-6), (name, logs)
    # The epoch's totals, as on sync strategies.
    assert float(loss_tracker(trainer.model).count.numpy()) == 60 * 16


def test_only_a_lost_workers_logs_are_skipped():
    from tfdist.strategies.ps.failures import lost_worker_output

    copy = (
        "{{function_node __wrapped__Identity_device_/job:chief/replica:0/task:0/device:CPU:0}} "
        "failed to connect to all addresses. Additional GRPC error information from remote "
        "target /job:worker/replica:0/task:1"
        "/device:CPU:0 while calling /tensorflow.eager.EagerService/RunComponentFunction"
    )
    assert lost_worker_output(tf.errors.UnavailableError(None, None, copy)) == "worker:1"
    ps_lost = copy.replace("/job:worker/replica:0/task:1", "/job:ps/replica:0/task:0")
    # A lost ps stops the run.
    assert lost_worker_output(tf.errors.UnavailableError(None, None, ps_lost)) is None
    # A real failure.
    assert lost_worker_output(tf.errors.InvalidArgumentError(None, None, copy)) is None


class _Seen(keras.metrics.Metric):
    """Examples seen so far this epoch: a running total, so each batch's logs differ."""

    def __init__(self, name="seen", dtype=None):
        super().__init__(name=name, dtype=dtype)
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.total.assign_add(tf.cast(tf.shape(y_true)[0], self.dtype))

    def result(self):
        return self.total


def test_logs_read_late_or_never_hold_their_batchs_values(ps):
    """Batch logs are computed when read; read late (after the fit) they are still that batch's.

    One callback keeps every batch's logs unread, another reads every 7th one
    at once (its values are the running total of examples, so each batch's
    logs differ), and the progress bar shows one line per epoch (verbose=2).
    """
    kept, read = {}, {}

    class Keeper(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            kept[batch] = logs

    class Reader(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch % 7 == 0:
                read[batch] = dict(logs)

    x, y = arrays(16)
    trainer = tfdist.Trainer(
        builder(initial_weights()),
        strategy=ps,
        optimizer=keras.optimizers.SGD(0.0),
        loss=LOSS,
        metrics=[_Seen()],
    )
    history = trainer.fit(
        lambda ctx: tf.data.Dataset.from_tensors((x, y)),
        epochs=1,
        steps_per_epoch=30,
        global_batch_size=16,
        callbacks=[Keeper(), Reader()],
        verbose=2,
    )
    loss = float(LOSS(y, trainer.model(x)))
    assert sorted(kept) == list(range(30)) and sorted(read) == list(range(0, 30, 7))
    for batch, logs in kept.items():
        assert isinstance(logs, dict) and list(logs) == ["loss", "seen"]
        assert logs["seen"] == 16 * (batch + 1), (batch, dict(logs))
        assert logs["loss"] == pytest.approx(loss, rel=1e-5)
        if batch in read:
            assert read[batch] == logs
    assert history.history["seen"] == [16 * 30]


@pytest.mark.parametrize("reads", [False, True], ids=["batch_logs_unread", "batch_logs_read"])
def test_epoch_logs_are_exact_whether_or_not_batch_logs_are_read(ps, reads):
    """Unread, a call returns no logs and adds its sums to the metric variables alone."""
    seen = []

    class Reader(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(logs["seen"])

    x, y = arrays(16)
    trainer = tfdist.Trainer(
        builder(initial_weights()),
        strategy=ps,
        optimizer=keras.optimizers.SGD(0.0),
        loss=LOSS,
        metrics=["accuracy", _Seen()],
    )
    history = trainer.fit(
        lambda ctx: tf.data.Dataset.from_tensors((x, y)),
        epochs=2,
        steps_per_epoch=25,
        global_batch_size=16,
        callbacks=[Reader()] if reads else [],
        verbose=0,
    )
    logits = trainer.model(x)
    assert history.history["seen"] == [16 * 25] * 2
    assert history.history["loss"] == pytest.approx([float(LOSS(y, logits))] * 2, rel=1e-5)
    accuracy = float(np.mean(np.argmax(logits, 1) == y))
    assert history.history["accuracy"] == pytest.approx([accuracy] * 2, abs=1e-6)
    assert float(loss_tracker(trainer.model).count.numpy()) == 25 * 16
    assert seen == ([16.0 * (b + 1) for b in range(25)] * 2 if reads else [])
