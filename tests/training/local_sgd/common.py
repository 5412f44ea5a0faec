"""What the local-SGD test modules share: the loss, the starting weights, the data and a
BatchNorm model (tests/jobs/common.py's tiny classifier)."""

import keras
import tensorflow as tf

from tests.jobs.common import GLOBAL_BATCH, data, initial_weights

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
W0 = initial_weights()


def dataset():
    """`tests.jobs.common.data`'s 96 examples in 6 global batches."""
    return tf.data.Dataset.from_tensor_slices(data()).batch(GLOBAL_BATCH)


def with_batch_norm():
    """Dense, BatchNormalization (moving statistics to average), Dense."""
    inputs = keras.Input((6,))
    hidden = keras.layers.BatchNormalization()(keras.layers.Dense(8)(inputs))
    return keras.Model(inputs, keras.layers.Dense(3)(hidden))
