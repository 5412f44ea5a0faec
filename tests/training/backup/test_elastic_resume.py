"""A backup resumes on another number of replicas: 2 -> 1 and 2 -> 4 mirrored, 2 -> 3 refused.

One process: the session has 4 virtual CPU devices (tests/conftest.py), so
MirroredStrategy runs on 1, 2, 3 or 4 of them side by side. The workers case
(2 MultiWorkerMirrored workers -> 1) is in tests/training/backup/test_backup_faults.py.
"""

import logging
import shutil

import keras
import numpy as np
import pytest

import tfdist
from tests.helpers import Crash
from tfdist.training.backup.writer import Backup

pytestmark = pytest.mark.slow  # about 8 s: three fits of 48 updates and two resumes

EPOCHS, GLOBAL_BATCH, FREQ = 3, 32, 3  # 16 updates per epoch, 48 in all


def _build():
    keras.utils.set_random_seed(5)
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Flatten(),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(10),
        ]
    )


def _fit(replicas, backup_dir=None, callbacks=()):
    trainer = tfdist.Trainer(
        _build,
        strategy=tfdist.make_strategy("mirrored", num_devices=replicas),
        optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        backup_dir=backup_dir,
        backup_freq=FREQ if backup_dir else None,
    )
    data = tfdist.data.load("synthetic", num_examples=512)
    trainer.fit(
        data, epochs=EPOCHS, global_batch_size=GLOBAL_BATCH, verbose=0, callbacks=list(callbacks)
    )
    return trainer


@pytest.fixture(scope="module")
def uninterrupted():
    return _fit(2).model.get_weights()


@pytest.fixture(scope="module")
def backup_on_two_replicas(tmp_path_factory):
    """A 2-replica run that crashed after global batch 22: its backup stands at 21 updates."""
    backup_dir = tmp_path_factory.mktemp("elastic") / "backup"
    with pytest.raises(RuntimeError, match="simulated crash"):
        _fit(2, str(backup_dir), callbacks=[Crash(after=22)])
    state = Backup(str(backup_dir), None, is_chief=True).read_state()
    assert (state["epoch"], state["step"], state["updates"], state["replicas"]) == (1, 5, 21, 2)
    return backup_dir


@pytest.mark.parametrize("replicas", [1, 4])
def test_resume_on_another_number_of_replicas(
    replicas, backup_on_two_replicas, uninterrupted, tmp_path, caplog
):
    backup_dir = tmp_path / "backup"
    shutil.copytree(backup_on_two_replicas, backup_dir)
    with caplog.at_level(logging.INFO, logger="tfdist.training.backup.writer"):
        resumed = _fit(replicas, str(backup_dir))
    assert (
        f"the backup was written on 2 replicas and resumes on {replicas}, at the same global "
        "step (21 updates done)" in caplog.text
    )
    assert "resuming at epoch 2, micro-batch 5 (21 updates done)" in caplog.text
    assert int(resumed.model.optimizer.iterations.numpy()) == EPOCHS * 16
    diff = max(
        float(np.max(np.abs(a - b))) for a, b in zip(resumed.model.get_weights(), uninterrupted)
    )
    print(f"2 -> {replicas} replicas: max abs weight difference {diff:.3g}")
    # The same global batches from the same update on; only the all-reduce's summation order
    # differs (float32 sums of 1, 2 or 4 per-replica gradients).
    assert diff <= 1e-5


def test_a_replica_count_that_does_not_divide_the_global_batch_is_refused(
    backup_on_two_replicas, tmp_path
):
    backup_dir = tmp_path / "backup"
    shutil.copytree(backup_on_two_replicas, backup_dir)
    with pytest.raises(ValueError) as e:
        _fit(3, str(backup_dir))
    message = str(e.value)
    assert "Received: global_batch_size=32" in message
    assert "cannot be split evenly across 3 replicas; the nearest valid values are 30 or 33" in (
        message
    )
    assert "To keep global_batch_size=32 (as a resumed backup needs" in message
    assert "run on 2 or 4 replicas, which divide it." in message
    # Refused before the backup is read: it still resumes on a valid number of replicas.
    state = Backup(str(backup_dir), None, is_chief=True).read_state()
    assert state == Backup(str(backup_on_two_replicas), None, is_chief=True).read_state()
