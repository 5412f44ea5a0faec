"""Partitioning (``min_shard_bytes``) with every Keras optimizer, in Trainer and user loops."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.strategies.ps_common import ps_strategy

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
OPTIMIZERS = sorted(
    n
    for n in dir(keras.optimizers)
    if n[0].isupper()
    and n not in ("Optimizer", "LossScaleOptimizer", "MultiOptimizer", "OptimizerMap")
)


def _batch():
    rng = np.random.default_rng(0)
    return rng.normal(size=(16, 32)).astype("float32"), rng.integers(0, 4, 16).astype("int32")


def _model():
    keras.utils.set_random_seed(3)
    return keras.Sequential(
        [keras.Input((32,)), keras.layers.Dense(64, activation="tanh"), keras.layers.Dense(4)]
    )


def _optimizer(name):
    options = {"learning_rate": 0.01}
    if name in ("AdamW", "Lion", "SGD", "Adam"):
        options["weight_decay"] = 0.1  # AdamW's default; the decay must reach sharded variables too
    return getattr(keras.optimizers, name)(**options)


@pytest.fixture(scope="module")
def sharded():
    # One worker: its steps run in order, so the run is deterministic and comparable.
    return ps_strategy(num_workers=1, num_ps=2, min_shard_bytes=1024)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_every_optimizer_updates_sharded_variables_exactly(sharded, name):
    x, y = _batch()
    reference = _model()
    opt = _optimizer(name)
    for _ in range(3):
        with tf.GradientTape() as tape:
            loss = LOSS(y, reference(x, training=True))
        opt.apply_gradients(
            zip(tape.gradient(loss, reference.trainable_variables), reference.trainable_variables)
        )

    trainer = tfdist.Trainer(_model, strategy=sharded, optimizer=_optimizer(name), loss=LOSS)
    kernel = trainer.model.trainable_variables[0]
    assert type(kernel.value).__name__ == "ShardedVariable"
    trainer.fit(
        lambda ctx: tf.data.Dataset.from_tensors(_batch()),
        epochs=1,
        steps_per_epoch=3,
        global_batch_size=16,
        verbose=0,
    )
    for ours, theirs in zip(trainer.model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(ours, theirs, atol=2e-5, rtol=1e-4)


def test_users_own_coordinator_loop_with_a_sharded_embedding(sharded):
    """The parameter-server tutorial's loop: sharded embedding, scheduled steps, apply_gradients."""
    with sharded.scope():
        model = keras.Sequential(
            [
                keras.Input((4,), dtype="int32"),
                keras.layers.Embedding(64, 16),
                keras.layers.GlobalAveragePooling1D(),
                keras.layers.Dense(1),
            ]
        )
        optimizer = keras.optimizers.RMSprop(0.01)
        accuracy = keras.metrics.BinaryAccuracy()
    embedding = model.layers[0].embeddings
    assert type(embedding.value).__name__ == "ShardedVariable"
    before = embedding.numpy()
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(sharded)

    def dataset_fn(_):
        x = np.random.default_rng(0).integers(0, 64, (64, 4)).astype("int32")
        return (
            tf.data.Dataset.from_tensor_slices((x, (x[:, :1] > 31).astype("float32")))
            .repeat()
            .batch(8)
        )

    iterator = iter(
        coordinator.create_per_worker_dataset(
            lambda: sharded.distribute_datasets_from_function(dataset_fn)
        )
    )

    @tf.function
    def step(iterator):
        def replica(x, y):
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = tf.reduce_mean(keras.losses.binary_crossentropy(y, logits, from_logits=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            accuracy.update_state(y, tf.sigmoid(logits))
            return loss

        return sharded.run(replica, args=next(iterator))

    losses = [coordinator.schedule(step, args=(iterator,)) for _ in range(6)]
    coordinator.join()
    assert all(np.isfinite(loss.fetch()) for loss in losses)
    assert int(optimizer.iterations.numpy()) == 6
    assert not np.allclose(embedding.numpy(), before)
    assert 0.0 <= float(accuracy.result()) <= 1.0


def test_the_sharded_variable_shims_are_still_needed():
    """Fails when upstream fixes what a shim works around: then drop it
    (_compat/tf_internals/partitioned.py)."""
    from tfdist import _compat

    assert _compat.sharded_variables_lack_handle()
    assert _compat.keras_weight_decay_uses_extended_update()
    assert _compat.keras_slots_colocate_with_reference()
    assert set(_compat.apply_sharded_variable_shims()) == {
        "sharded_gradients",
        "sharded_weight_decay",
        "sharded_slots",
    }


@pytest.mark.parametrize("name", ["Adam", "SGD"])
def test_a_sharded_embedding_gets_keras_numbers(sharded, name):
    """An ``Embedding`` partitioned over 2 ps tasks: its shards' ``tf.IndexedSlices`` join into
    one sparse gradient (each shard's rows moved by its first row), so Adam squares each row
    as Keras does on one device; tokens repeat in the batch."""
    rng = np.random.default_rng(1)
    x = rng.integers(0, 8, (16, 6)).astype("int32")  # 8 of 64 rows, many duplicates
    y = rng.integers(0, 4, 16).astype("int32")

    def model():
        keras.utils.set_random_seed(4)
        return keras.Sequential(
            [
                keras.Input((6,), dtype="int32"),
                keras.layers.Embedding(64, 16),
                keras.layers.GlobalAveragePooling1D(),
                keras.layers.Dense(4),
            ]
        )

    reference = model()
    reference.compile(optimizer=getattr(keras.optimizers, name)(0.05), loss=LOSS)
    reference.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
    trainer = tfdist.Trainer(
        model, strategy=sharded, optimizer=getattr(keras.optimizers, name)(0.05), loss=LOSS
    )
    assert type(trainer.model.layers[0].embeddings.value).__name__ == "ShardedVariable"
    trainer.fit(
        lambda ctx: tf.data.Dataset.from_tensors((x, y)).repeat(),
        epochs=1,
        steps_per_epoch=3,
        global_batch_size=16,
        verbose=0,
    )
    for ours, theirs in zip(trainer.model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)
