"""A worker program: trains a tiny model with SyncBatchNorm under the Trainer, saves its weights.

Run under ``tfdist launch --workers=2 -- python tests/jobs/sync_bn_job.py OUT_DIR``; each task
writes OUT_DIR/<task>.npz. The model and data are shared with the in-process tests.
"""

import json
import os
import sys

import keras
import numpy as np
import tensorflow as tf

GLOBAL_BATCH = 16


def bn_model(synchronized, weights=None):
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8),
            keras.layers.BatchNormalization(synchronized=synchronized, momentum=0.5),
            keras.layers.Activation("tanh"),
            keras.layers.Dense(3),
        ]
    )
    if weights is not None:
        model.set_weights(weights)
    return model


def bn_weights():
    keras.utils.set_random_seed(4)
    return bn_model(True).get_weights()


def bn_data(n=64):
    # Every global batch spans the whole range of the first feature, and each
    # of 4 replicas (2 replicas: each half) gets one quarter of that range, so
    # local and global batch statistics differ clearly.
    x = np.random.default_rng(0).normal(size=(n, 6)).astype("float32")
    x = x[np.argsort(x[:, 0])]  # quarter q holds sorted rows 16q..16q+15
    quarters, batches = 4, n // GLOBAL_BATCH
    order = (
        np.arange(n)
        .reshape(quarters, batches, GLOBAL_BATCH // quarters)
        .transpose(1, 0, 2)
        .reshape(-1)
    )
    x = x[order] * np.linspace(0.5, 3.0, 6, dtype="float32")
    y = (x.sum(1) > 0).astype("int32") + (x[:, 0] > 1).astype("int32")
    return x, y


def bn_train(strategy, synchronized, weights):
    """Two epochs of SGD under the Trainer; returns the weights (moving statistics included)."""
    import tfdist

    x, y = bn_data()
    trainer = tfdist.Trainer(
        lambda: bn_model(synchronized, weights),
        strategy=strategy,
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    trainer.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH), epochs=2, verbose=0)
    return [np.asarray(w) for w in trainer.model.get_weights()]


if __name__ == "__main__":
    import tfdist

    strategy = tfdist.make_strategy("multi_worker")
    out_dir = sys.argv[1]
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    weights = bn_train(strategy, True, bn_weights())
    np.savez(os.path.join(out_dir, f"{task['type']}-{task['index']}.npz"), *weights)
    print("done", strategy.num_replicas_in_sync)
