"""Gradient accumulation, fp16 loss scaling and learning-rate scaling/warmup."""

import glob

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.jobs.common import builder, data, initial_weights
from tfdist._compat.keras_internals.keras_training import concrete_functions
from tfdist.training.build.lr_schedules import ScaledWarmup

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
MICRO = 8


def _ds(n, global_batch):
    return tf.data.Dataset.from_tensor_slices(data(n)).batch(global_batch)


def _fit(strategy, global_batch, k, n=96, epochs=2, optimizer=None, **kwargs):
    trainer = tfdist.Trainer(
        builder(initial_weights()),
        strategy=strategy,
        optimizer=optimizer or keras.optimizers.SGD(0.1),
        loss=LOSS,
        accumulation_steps=k,
        **kwargs,
    )
    history = trainer.fit(_ds(n, global_batch), epochs=epochs, verbose=0)
    return trainer, history


@pytest.mark.parametrize("kind,options", [("one_device", {}), ("mirrored", {"num_devices": 2})])
@pytest.mark.parametrize("k", [2, 4])
def test_k_micro_batches_equal_one_big_batch(kind, options, k):
    strategy = tfdist.make_strategy(kind, **options)
    reference, _ = _fit(tfdist.make_strategy("one_device"), MICRO * k, 1)
    trainer, history = _fit(strategy, MICRO, k)
    for a, b in zip(reference.model.get_weights(), trainer.model.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    updates = 2 * 96 // (MICRO * k)
    assert int(trainer.model.optimizer.iterations.numpy()) == updates
    assert history.history["updates"][-1] == updates


def test_last_partial_window_is_normalised():
    # 112 examples = 14 micro-batches of 8; k=4 -> 3 updates of 32 and one of 16.
    reference, _ = _fit(tfdist.make_strategy("one_device"), 32, 1, n=112, epochs=1)
    trainer, _ = _fit(tfdist.make_strategy("mirrored", num_devices=2), MICRO, 4, n=112, epochs=1)
    for a, b in zip(reference.model.get_weights(), trainer.model.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    assert int(trainer.model.optimizer.iterations.numpy()) == 4


def test_one_all_reduce_per_update(monkeypatch):
    calls = []
    original = tf.distribute.ReplicaContext.all_reduce

    def counting(self, reduce_op, value, options=None):
        calls.append(len(tf.nest.flatten(value)))
        return original(self, reduce_op, value, options)

    monkeypatch.setattr(tf.distribute.ReplicaContext, "all_reduce", counting)
    strategy = tfdist.make_strategy("mirrored", num_devices=2)
    trainer, _ = _fit(strategy, MICRO, 4, epochs=1, steps_per_execution=8)
    # The update (4 micro-batches) is traced once per replica: one all-reduce
    # of every gradient plus the example count, and none inside the optimizer.
    # After the loop, the logs reduce all metric state (loss total and count) in one packed tensor.
    n_vars = len(trainer.model.trainable_variables)
    assert calls == [n_vars + 1] * 2 + [1] * 2


def test_keras_gradient_accumulation_steps_is_taken_over():
    strategy = tfdist.make_strategy("mirrored", num_devices=2)
    ours, _ = _fit(strategy, MICRO, 4)
    theirs, _ = _fit(
        strategy, MICRO, 1, optimizer=keras.optimizers.SGD(0.1, gradient_accumulation_steps=4)
    )
    assert theirs.accumulation_steps == 4
    assert theirs.model.optimizer.gradient_accumulation_steps is None
    for a, b in zip(ours.model.get_weights(), theirs.model.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
    with pytest.raises(
        ValueError,
        match="argument `accumulation_steps`. Received: accumulation_steps=2. "
        "Expected 1 or 4.*gradient_accumulation_steps=4",
    ):
        tfdist.Trainer(
            builder(),
            strategy=strategy,
            loss=LOSS,
            accumulation_steps=2,
            optimizer=keras.optimizers.SGD(0.1, gradient_accumulation_steps=4),
        )


def test_forced_overflow_skips_the_update_and_lowers_the_scale():
    strategy = tfdist.make_strategy("mirrored", num_devices=2)
    optimizer = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.1), initial_scale=2.0**60
    )
    trainer = tfdist.Trainer(
        builder(initial_weights()),
        strategy=strategy,
        optimizer=optimizer,
        loss=LOSS,
        precision="mixed_float16",
        accumulation_steps=2,
    )
    before = trainer.model.get_weights()
    history = trainer.fit(_ds(96, MICRO), epochs=1, steps_per_epoch=2, verbose=0)
    assert history.history["skipped_updates"] == [1]
    assert history.history["loss_scale"] == [2.0**59]
    assert int(trainer.model.optimizer.iterations.numpy()) == 0  # counts applied updates
    for a, b in zip(before, trainer.model.get_weights()):
        np.testing.assert_array_equal(a, b)
    # With a sane scale the next updates apply.
    trainer.model.optimizer.dynamic_scale.assign(2.0**10)
    history = trainer.fit(_ds(96, MICRO), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert (
        int(trainer.model.optimizer.iterations.numpy())
        == 6 - history.history["skipped_updates"][0] + 1
    )


def test_warmup_and_linear_scaling_values():
    goyal = ScaledWarmup(0.1, multiplier=4.0, warmup_steps=10, warmup_from_base=True)
    assert [round(float(goyal(s)), 6) for s in (0, 5, 10, 20)] == [0.1, 0.25, 0.4, 0.4]
    plain = ScaledWarmup(0.1, warmup_steps=4, warmup_from_base=False)
    assert [round(float(plain(s)), 6) for s in (0, 1, 4, 9)] == [0.0, 0.025, 0.1, 0.1]
    schedule = ScaledWarmup(
        keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5), multiplier=2.0
    )
    assert float(schedule(10)) == pytest.approx(0.1)
    restored = ScaledWarmup.from_config(schedule.get_config())
    assert float(restored(10)) == pytest.approx(0.1)


def test_trainer_learning_rate_in_logs_and_tensorboard(tmp_path):
    strategy = tfdist.make_strategy("mirrored", num_devices=2)
    # effective batch 8*4 = 32 over a base of 16: lr 0.1 -> 0.2, warmed up over 1 epoch (3 updates).
    trainer = tfdist.Trainer(
        builder(initial_weights()),
        strategy=strategy,
        optimizer=keras.optimizers.SGD(0.1),
        loss=LOSS,
        accumulation_steps=4,
        lr_scaling="linear",
        base_global_batch_size=16,
        warmup_epochs=1,
    )
    history = trainer.fit(
        _ds(96, MICRO), epochs=2, verbose=0, callbacks=[keras.callbacks.TensorBoard(str(tmp_path))]
    )
    # After epoch 1: 3 updates done = end of warmup -> 0.2; stays there.
    assert history.history["learning_rate"] == pytest.approx([0.2, 0.2])
    assert float(trainer.model.optimizer.learning_rate) == pytest.approx(0.2)
    assert float(trainer.learning_rate_schedule(1)) == pytest.approx(0.1 + 0.1 / 3)
    tags = set()
    for path in glob.glob(str(tmp_path / "train" / "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            tags.update(v.tag for v in event.summary.value)
    assert "epoch_learning_rate" in tags


@pytest.mark.parametrize(
    "kwargs,pattern",
    [
        (
            {"lr_scaling": "sqrt"},
            "argument `lr_scaling`. Received: lr_scaling='sqrt'. Expected one of: linear, none",
        ),
        ({"warmup_steps": -1}, "argument `warmup_steps`. Received: warmup_steps=-1"),
        ({"warmup_steps": 5, "warmup_epochs": 1}, "argument `warmup_epochs`.*pass one of them"),
        (
            {"base_global_batch_size": 0},
            "argument `base_global_batch_size`. Received: base_global_batch_size=0",
        ),
    ],
)
def test_schedule_errors(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        tfdist.Trainer(builder(), strategy=tfdist.make_strategy("one_device"), loss=LOSS, **kwargs)


def _graph_size(tf_function):
    """Nodes in a traced tf.function, its nested function bodies (loops, conds) included."""
    total = 0
    for concrete in concrete_functions(tf_function):
        graph_def = concrete.graph.as_graph_def()
        total += len(graph_def.node) + sum(len(f.node_def) for f in graph_def.library.function)
    return total


def test_accumulation_graph_does_not_grow_with_k():
    # The k micro-batches are a tf.while_loop, not k unrolled copies of the forward and backward
    # pass.
    sizes = {}
    for k in (1, 2, 16):
        trainer, _ = _fit(
            tfdist.make_strategy("mirrored", num_devices=2), MICRO, k, n=MICRO * 16, epochs=1
        )
        assert list(trainer.train_functions) == [
            (MICRO, k)
        ]  # whole updates only: one train function
        sizes[k] = _graph_size(trainer.train_functions[(MICRO, k)])
    assert sizes[16] == sizes[2]
    assert sizes[16] < 1.5 * sizes[1]
