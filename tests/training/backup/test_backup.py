"""Backup and restore in one process: exact resume, removal, PS with sharded variables, errors."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.helpers import Crash
from tfdist.training.backup import files as backup_files
from tfdist.training.backup.writer import Backup

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


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


def _trainer(strategy, backup_dir, **kwargs):
    return tfdist.Trainer(
        _build,
        strategy=strategy,
        optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
        loss=LOSS,
        backup_dir=backup_dir,
        **kwargs,
    )


def test_resume_is_exact_and_the_backup_is_removed(tmp_path):
    strategy = tfdist.make_strategy("mirrored", num_devices=2)
    data = tfdist.data.load("synthetic", num_examples=512)
    reference = _trainer(strategy, None)
    reference.fit(data, epochs=3, global_batch_size=32, verbose=0)

    backup_dir = str(tmp_path / "backup")
    first = _trainer(strategy, backup_dir, backup_freq=3)
    with pytest.raises(RuntimeError, match="simulated crash"):
        first.fit(data, epochs=3, global_batch_size=32, verbose=0, callbacks=[Crash(after=22)])
    state = Backup(backup_dir, None, is_chief=True).read_state()
    assert (state["epoch"], state["step"], state["updates"]) == (
        1,
        5,
        21,
    )  # last multiple of 3 updates

    resumed = _trainer(strategy, backup_dir, backup_freq=3)
    history = resumed.fit(data, epochs=3, global_batch_size=32, verbose=0)
    assert len(history.history["loss"]) == 2  # epochs 2 and 3
    assert int(resumed.model.optimizer.iterations.numpy()) == 48
    for a, b in zip(reference.model.get_weights(), resumed.model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert not os.path.exists(backup_dir)  # removed after the successful run


def test_keep_backup(tmp_path):
    strategy = tfdist.make_strategy("one_device")
    trainer = _trainer(strategy, str(tmp_path / "b"), keep_backup=True)
    trainer.fit(
        tfdist.data.load("synthetic", num_examples=128), epochs=2, global_batch_size=32, verbose=0
    )
    state = Backup(str(tmp_path / "b"), None, is_chief=True).read_state()
    assert (state["epoch"], state["step"], state["updates"]) == (2, 0, 8)
    # A finished backup resumes as "nothing left to do".
    again = _trainer(strategy, str(tmp_path / "b"), keep_backup=True)
    history = again.fit(
        tfdist.data.load("synthetic", num_examples=128), epochs=2, global_batch_size=32, verbose=0
    )
    assert history.history == {} and int(again.model.optimizer.iterations.numpy()) == 8


def test_parameter_server_resumes_after_a_coordinator_crash(tmp_path, monkeypatch):
    # A slow disk: updates 11 and 12 run while the backup at update 10 is committed.
    monkeypatch.setenv(backup_files.SLOW_FSYNC_ENV, "100")
    strategy = tfdist.make_strategy(
        "parameter_server", num_workers=2, num_ps=2, min_shard_bytes=1024, allow_late_connect=True
    )  # earlier tests ran TF in this process
    data = tfdist.data.load("synthetic", num_examples=512)
    backup_dir = str(tmp_path / "ps-backup")
    first = _trainer(strategy, backup_dir, backup_freq=5)
    assert type(first.model.layers[1].kernel.value).__name__ == "ShardedVariable"
    with pytest.raises(RuntimeError, match="simulated crash"):
        first.fit(
            data,
            epochs=2,
            steps_per_epoch=10,
            global_batch_size=32,
            verbose=0,
            callbacks=[Crash(after=12)],
        )
    saved = [np.asarray(w) for w in first.model.get_weights()]
    state = Backup(backup_dir, None, is_chief=True).read_state()
    assert (state["epoch"], state["step"], state["updates"]) == (1, 0, 10)
    # The optimizer's iterations as written: those of the save call, not of the updates after.
    iterations = tf.train.load_variable(
        os.path.join(backup_dir, state["checkpoint"]),
        "objects/optimizer/0/.ATTRIBUTES/VARIABLE_VALUE",
    )
    assert int(iterations) == 10

    resumed = _trainer(strategy, backup_dir, backup_freq=5)
    fresh = [np.asarray(w) for w in resumed.model.get_weights()]
    history = resumed.fit(data, epochs=2, steps_per_epoch=10, global_batch_size=32, verbose=0)
    assert len(history.history["loss"]) == 1
    assert (
        int(resumed.model.optimizer.iterations.numpy()) == 20
    )  # exact, no update lost or repeated
    assert any(
        not np.array_equal(a, b) for a, b in zip(saved, fresh)
    )  # sanity: the new model started elsewhere


@pytest.mark.parametrize("freq", [0, "step", 2.5, True])
def test_backup_freq_errors(freq):
    with pytest.raises(
        ValueError, match="argument `backup_freq`.*Expected 'epoch' or a positive number"
    ):
        _trainer(tfdist.make_strategy("one_device"), "/tmp/unused", backup_freq=freq)
