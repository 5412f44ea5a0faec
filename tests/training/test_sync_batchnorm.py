"""SyncBatchNorm: `BatchNormalization(synchronized=True)` under the Trainer uses global-batch statistics.

N replicas x b must equal one replica on the N*b global batch: the weights and
the moving mean/variance. With unsynchronised BatchNorm each replica normalises
by its own local statistics, so the same comparison fails (checked below, so the
test cannot pass vacuously). The 2-worker MultiWorkerMirrored version is
``tests/strategies/test_multi_worker.py::test_sync_batchnorm_matches_one_replica``.
"""
import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist

G = 16


def bn_model(synchronized, weights=None):
    model = keras.Sequential([
        keras.Input((6,)),
        keras.layers.Dense(8),
        keras.layers.BatchNormalization(synchronized=synchronized, momentum=0.5),
        keras.layers.Activation("tanh"),
        keras.layers.Dense(3),
    ])
    if weights is not None:
        model.set_weights(weights)
    return model


def bn_data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    # Every global batch spans the whole range of the first feature, and
    # each of 4 replicas gets one quarter of that range: local and global
    # batch statistics differ clearly.
    x = rng.normal(size=(n, 6)).astype("float32")
    x = x[np.argsort(x[:, 0])]  # quarter q holds sorted rows 16q..16q+15
    quarters, batches = 4, n // G
    order = np.arange(n).reshape(quarters, batches, G // quarters).transpose(1, 0, 2).reshape(-1)
    x = x[order] * np.linspace(0.5, 3.0, 6, dtype="float32")
    y = (x.sum(1) > 0).astype("int32") + (x[:, 0] > 1).astype("int32")
    return x, y


def train(strategy, synchronized, weights):
    x, y = bn_data()
    trainer = tfdist.Trainer(lambda: bn_model(synchronized, weights), strategy=strategy,
                             optimizer=keras.optimizers.SGD(0.1),
                             loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    trainer.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(G), epochs=2, verbose=0)
    return [np.asarray(w) for w in trainer.model.get_weights()]


@pytest.fixture(scope="module")
def weights():
    keras.utils.set_random_seed(4)
    return bn_model(True).get_weights()


@pytest.fixture(scope="module")
def reference(weights):
    return train(tfdist.make_strategy("one_device"), False, weights)


@pytest.mark.parametrize("num_devices", [2, 4])
def test_sync_batchnorm_matches_one_replica_on_the_global_batch(weights, reference, num_devices):
    got = train(tfdist.make_strategy("mirrored", num_devices=num_devices), True, weights)
    assert max(np.abs(a - b).max() for a, b in zip(weights, reference)) > 1e-2  # training moved things
    for a, b in zip(reference, got):  # kernels, gamma/beta, moving mean and variance
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def test_unsynchronized_batchnorm_differs(weights, reference):
    local = train(tfdist.make_strategy("mirrored", num_devices=4), False, weights)
    assert max(np.abs(a - b).max() for a, b in zip(reference, local)) > 1e-2
