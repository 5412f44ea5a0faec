"""Parity rows for what already worked: a compiled loss and metrics, sample weights in data.

Also the data shapes every strategy must split the same way: a partial last batch (odd, so the
2 multi_worker replicas get unequal halves), validation data, and a seeded shuffle (every worker
draws the same order, and PS's repeated dataset reshuffles per pass as Keras's epochs do).
"""

import keras
import numpy as np
import tensorflow as tf

from tests.keras_parity.parity import Row, fixed_weights

N, FEATURES, CLASSES = 96, 6, 3


def arrays(seed=0, n=N):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, FEATURES)).astype("float32")
    y = (x[:, 0] > 0).astype("int32") + (x[:, 1] > 0.5).astype("int32")
    w = rng.uniform(0.5, 2.0, n).astype("float32")
    return x, y, w


def mlp():
    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dense(CLASSES),
        ]
    )
    return fixed_weights(model)


def sgd_compile():
    return dict(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )


def dataset_fit(with_weights=False):
    def fit():
        x, y, w = arrays()
        parts = (x, y, w) if with_weights else (x, y)
        return dict(x=tf.data.Dataset.from_tensor_slices(parts).batch(16), epochs=2)

    return fit


def partial_batch_fit():
    # 101 = 6 * 16 + 5: the last batch of 5 splits 3 + 2 over two replicas.
    x, y, _ = arrays(n=101)
    return dict(x=tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=2)


def validation_fit():
    x, y, _ = arrays()
    vx, vy, _ = arrays(seed=1, n=37)
    return dict(
        x=tf.data.Dataset.from_tensor_slices((x, y)).batch(16),
        validation_data=tf.data.Dataset.from_tensor_slices((vx, vy)).batch(16),
        epochs=2,
    )


# Each iterator over a reshuffling dataset draws the next order. Keras makes two per epoch
# (keras/src/trainers/epoch_iterator.py, EpochIterator._enumerate_iterator: one when an epoch of
# known length ends, for a fit with steps_per_epoch, and one when the next epoch begins if it has
# none), so its epoch e reads pass 2e-1; with steps_per_epoch it reads on: epoch e, pass e. The
# Trainer learns the batch size without an iterator (tf.data's graph analysis) and makes the same
# spare iterator (InputSource.spare_iterator). parameter_server requires steps_per_epoch (the
# harness gives one pass; Keras's reference has none): it runs the _steps row.
def shuffled_fit(steps_per_epoch=None):
    def fit():
        x, y, _ = arrays()
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(
            N, seed=7, reshuffle_each_iteration=True
        )
        return dict(x=ds.batch(16), epochs=2, steps_per_epoch=steps_per_epoch)

    return fit


def any_batch_size(fitted):
    """``predict`` and ``evaluate`` on batches that 2 replicas (or workers) cannot split evenly.

    Keras takes any batch size; the Trainer splits a batch of b into ceil(b/2) and floor(b/2)
    examples (a batch of 1: one replica gets none), and gathers the outputs in input order.
    """
    x, y, w = arrays(seed=2, n=37)
    sizes_3_then_7 = (
        tf.data.Dataset.from_tensor_slices(x[:20])
        .batch(3)
        .concatenate(tf.data.Dataset.from_tensor_slices(x[20:]).batch(7))
    )
    weighted_3 = tf.data.Dataset.from_tensor_slices((x, y, w)).batch(3)
    return {
        "predict_arrays_batch_3": fitted.predict(x, batch_size=3, verbose=0),
        "predict_dataset_batches_3_then_7": fitted.predict(sizes_3_then_7, verbose=0),
        "evaluate_arrays_batch_5": fitted.evaluate(x, y, sample_weight=w, batch_size=5, verbose=0),
        "evaluate_dataset_batch_3": fitted.evaluate(weighted_3, verbose=0),
    }


def one_epoch_fit():
    x, y, _ = arrays()
    return dict(x=tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=1)


ROWS = [
    Row("dataset", mlp, sgd_compile, dataset_fit()),
    Row("dataset_sample_weight", mlp, sgd_compile, dataset_fit(with_weights=True)),
    Row("dataset_partial_batch", mlp, sgd_compile, partial_batch_fit),
    Row("dataset_validation_data", mlp, sgd_compile, validation_fit),
    Row(
        "dataset_shuffled_seeded",
        mlp,
        sgd_compile,
        shuffled_fit(),
        strategies=("mirrored", "multi_worker"),
    ),
    Row("dataset_shuffled_seeded_steps", mlp, sgd_compile, shuffled_fit(steps_per_epoch=N // 16)),
    Row(
        "predict_evaluate_any_batch_size", mlp, sgd_compile, one_epoch_fit, inference=any_batch_size
    ),
]
