"""SyncBatchNorm on two real MultiWorkerMirrored workers equals one replica on the global batch."""

import os
import sys

import numpy as np
import pytest

import tfdist
from tests.helpers import PRELOAD, REPO, run_tfdist
from tests.jobs.sync_bn_job import bn_train, bn_weights

pytestmark = pytest.mark.multiprocess


def test_sync_batchnorm_matches_one_replica(tmp_path):
    job = os.path.join(REPO, "tests", "jobs", "sync_bn_job.py")
    proc = run_tfdist("launch", "--workers=2", PRELOAD, "--", sys.executable, job, str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "[worker:0] done 2" in proc.stdout
    reference = bn_train(tfdist.make_strategy("one_device"), False, bn_weights())
    for worker in (0, 1):
        with np.load(tmp_path / f"worker-{worker}.npz") as f:
            got = [f[f"arr_{i}"] for i in range(len(f.files))]
        for a, b in zip(reference, got):  # moving mean and variance included
            np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
