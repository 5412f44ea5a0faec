"""Keras parity on 2 real MultiWorkerMirroredStrategy workers (1 replica each).

ONE ``tfdist launch --workers=2`` runs every row with "multi_worker" in its strategies
(``tests/jobs/parity_job.py``); each row's test then compares both workers' results with plain
Keras on one device here, and the workers with each other (bitwise: one all-reduce, one model).
A row's data are global batches, split across the workers by ``tf.data`` autosharding (DATA, also
for a dataset read from files, whose default AUTO policy would split by FILE);
:func:`test_autosharding_splits_each_global_batch` checks that split on its own.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import PRELOAD, REPO, run_tfdist
from tests.keras_parity.parity import assert_same, load_result, rows_on
from tests.keras_parity.rows import ROWS
from tests.keras_parity.rows_balance import SPLITS

JOB = os.path.join(REPO, "tests", "jobs", "parity_job.py")
WORKERS = ("worker-0", "worker-1")
pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """One 2-worker launch for every row: (its output, or the timeout's; the output folder)."""
    out_dir = tmp_path_factory.mktemp("parity_mwms")
    try:
        # Under pytest's 600 s timeout, so that a stuck row's output still reaches the tests.
        proc = run_tfdist(
            "launch", "--workers=2", PRELOAD, "--", sys.executable, JOB, str(out_dir), timeout=540
        )
        return proc.returncode, proc.stdout, out_dir
    except subprocess.TimeoutExpired as e:
        return "timeout", e.output or "", out_dir


def _outputs(launched, name):
    """The two workers' saved results of ``name``, or a failure that says why there are none."""
    code, stdout, out_dir = launched
    errors = [out_dir / f"{name}-{w}.error" for w in WORKERS]
    if any(e.exists() for e in errors):
        pytest.fail("\n".join(f"{e.name}:\n{e.read_text()}" for e in errors if e.exists()))
    missing = [w for w in WORKERS if not (out_dir / f"{name}-{w}.json").exists()]
    if missing:
        pytest.fail(f"no result from {missing} (launch exit: {code}); output:\n{stdout[-4000:]}")
    return [str(out_dir / f"{name}-{w}") for w in WORKERS]


def test_launch_succeeded(launched):
    code, stdout, _ = launched
    assert code == 0, stdout[-4000:]
    assert "[worker:0] parity job done 2" in stdout and "[worker:1] parity job done 2" in stdout


@pytest.mark.parametrize(
    "name", ["_shards", "_shards_files"], ids=["from_tensor_slices", "tfrecord_files"]
)
def test_autosharding_splits_each_global_batch(launched, name):
    """Worker 0's then worker 1's share of step i is global batch i, as Keras reads it.

    From 2 TFRecord files too: under tf.data's AUTO policy each worker would read its own file
    (FILE sharding), and the steps' batches would not be Keras's; the Trainer asks for DATA.
    """
    w0, w1 = (json.loads(open(p + ".json").read()) for p in _outputs(launched, name))
    n, batch = w0["examples"], w0["batch"]
    keras_batches = [list(range(n))[i : i + batch] for i in range(0, n, batch)]
    w0, w1 = w0["steps"], w1["steps"]
    assert len(w0) == len(w1) == len(keras_batches), (w0, w1)
    assert [a + b for a, b in zip(w0, w1)] == keras_batches, (w0, w1)


@pytest.mark.parametrize("row", rows_on("multi_worker", ROWS))
def test_trainer_on_two_workers_matches_keras(row, launched, keras_reference):
    results = [load_result(p) for p in _outputs(launched, row.name)]
    reference = keras_reference(row)
    for result in results:
        assert_same(row, reference, result)
    for a, b in zip(results[0].weights, results[1].weights):
        np.testing.assert_array_equal(a, b)  # both workers hold the same model
    assert results[0].history == results[1].history


def test_balanced_rows_change_their_split_within_each_epoch(launched):
    """The balanced rows (``rows_balance.py``) train on every forced split, as the chief says."""
    _, stdout, _ = launched
    rows = [r for r in ROWS if "balance" in r.trainer]
    assert rows
    for _, (a, b) in SPLITS:
        said = f"Balance: worker:0 takes {a}, worker:1 takes {b} of every global batch of 16"
        lines = [line for line in stdout.splitlines() if said in line]
        # Each balanced row's fit takes each split once, the chief alone logging it.
        assert len(lines) == len(rows), (said, lines)
        assert all(line.startswith("[worker:0]") for line in lines)
