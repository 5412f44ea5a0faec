"""SyncBatchNorm: `BatchNormalization(synchronized=True)` under the Trainer uses global-batch
statistics.

N replicas x b must equal one replica on the N*b global batch: the weights and
the moving mean/variance. With unsynchronised BatchNorm each replica normalises
by its own local statistics, so the same comparison fails (checked below, so the
test cannot pass vacuously). The 2-worker MultiWorkerMirrored version is
``tests/strategies/test_sync_batchnorm_multi_worker.py``.
"""

import numpy as np
import pytest

import tfdist
from tests.jobs.sync_bn_job import bn_train, bn_weights


@pytest.fixture(scope="module")
def weights():
    return bn_weights()


@pytest.fixture(scope="module")
def reference(weights):
    return bn_train(tfdist.make_strategy("one_device"), False, weights)


@pytest.mark.parametrize("num_devices", [2, 4])
def test_sync_batchnorm_matches_one_replica_on_the_global_batch(weights, reference, num_devices):
    got = bn_train(tfdist.make_strategy("mirrored", num_devices=num_devices), True, weights)
    assert (
        max(np.abs(a - b).max() for a, b in zip(weights, reference)) > 1e-2
    )  # training moved things
    for a, b in zip(reference, got):  # kernels, gamma/beta, moving mean and variance
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def test_unsynchronized_batchnorm_differs(weights, reference):
    local = bn_train(tfdist.make_strategy("mirrored", num_devices=4), False, weights)
    assert max(np.abs(a - b).max() for a, b in zip(reference, local)) > 1e-2
