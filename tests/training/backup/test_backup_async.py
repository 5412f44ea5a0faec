"""Asynchronous backups in one process: training goes on during the commit, failures surface.

The slow disk is ``backup_files.SLOW_FSYNC_ENV`` (each fsync of a commit sleeps first), so
that a commit takes long enough to be seen in flight.
"""

import json
import os
import tempfile

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.training.backup import files as backup_files
from tfdist.training.backup.writer import Backup, Position

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
DATA = tfdist.data.load("synthetic", num_examples=128)  # 4 batches of 32
SLOW_MS = 300  # 5 fsyncs per commit: at least 1.5 s in flight


def _build():
    keras.utils.set_random_seed(5)
    return keras.Sequential(
        [keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(10)]
    )


def _trainer(backup, strategy="one_device"):
    return tfdist.Trainer(
        _build,
        # Two replicas, whatever virtual devices an earlier test in this process made.
        strategy=tfdist.make_strategy(
            strategy, **({"num_devices": 2} if strategy == "mirrored" else {})
        ),
        optimizer=keras.optimizers.SGD(0.05),
        loss=LOSS,
        backup=backup,
    )


def _state(backup_dir):
    path = backup_dir / "state.json"
    return json.loads(path.read_text()) if path.exists() else None


def test_a_save_returns_before_its_commit_and_keeps_the_values_of_the_call(tmp_path, monkeypatch):
    monkeypatch.setenv(backup_files.SLOW_FSYNC_ENV, str(SLOW_MS))
    variable = tf.Variable(1.0)
    backup = Backup(
        str(tmp_path), tf.train.Checkpoint(v=variable), is_chief=True, asynchronous=True
    )
    backup.save(Position(0, 3, 3))
    assert _state(tmp_path) is None  # still being written and committed in the background
    variable.assign(2.0)  # training goes on
    backup.save(Position(0, 6, 6))  # waits for the first commit, then goes on in the background
    assert _state(tmp_path)["checkpoint"] == "ckpt-1"
    variable.assign(3.0)
    backup.wait()
    state = _state(tmp_path)
    assert (state["checkpoint"], state["updates"]) == ("ckpt-2", 6)
    assert not list(tmp_path.glob("ckpt-1*"))  # keep_backups=1: deleted after ckpt-2's commit

    restored = tf.Variable(0.0)
    position = Backup(str(tmp_path), tf.train.Checkpoint(v=restored), is_chief=True).restore()
    assert position == Position(0, 6, 6)
    assert float(restored.numpy()) == 2.0  # the value at the save call, not the later 3.0


def test_the_synchronous_opt_out_commits_before_save_returns(tmp_path, monkeypatch):
    monkeypatch.setenv(backup_files.SLOW_FSYNC_ENV, "50")
    backup = Backup(str(tmp_path), tf.train.Checkpoint(v=tf.Variable(1.0)), is_chief=True)
    assert backup.asynchronous is False  # a Backup made directly (the Keras callback's)
    backup.save(Position(0, 3, 3))
    assert _state(tmp_path)["checkpoint"] == "ckpt-1"


def test_a_failed_commit_is_raised_at_the_next_save_naming_backup_dir(tmp_path, monkeypatch):
    def disk_full(backup_dir, state):
        raise OSError(28, "No space left on device")

    backup = Backup(
        str(tmp_path), tf.train.Checkpoint(v=tf.Variable(1.0)), is_chief=True, asynchronous=True
    )
    monkeypatch.setattr(backup_files, "commit_state", disk_full)
    backup.save(Position(0, 3, 3))  # returns: the commit fails in the background
    with pytest.raises(RuntimeError, match=r"ckpt-1 .*backup_dir='.*'.*No space left on device"):
        backup.save(Position(0, 6, 6))
    assert _state(tmp_path) is None
    monkeypatch.undo()
    backup.save(Position(0, 9, 9))  # the error was raised once; the next save works
    backup.wait()
    assert _state(tmp_path)["updates"] == 9


def test_a_failed_write_is_raised_by_wait(tmp_path):
    # A directory where TF's write puts the checkpoint's index: the write itself fails, in
    # TF's writer thread, so its callback (the commit) never runs.
    (tmp_path / "ckpt-1.index").mkdir()
    backup = Backup(
        str(tmp_path), tf.train.Checkpoint(v=tf.Variable(1.0)), is_chief=True, asynchronous=True
    )
    backup.save(Position(0, 3, 3))
    with pytest.raises(RuntimeError, match=rf"ckpt-1 .*backup_dir='{tmp_path}'"):
        backup.wait()
    assert _state(tmp_path) is None
    backup.wait()  # raised once


def test_a_worker_removes_its_temporary_write_once_it_is_complete(tmp_path, monkeypatch):
    monkeypatch.setenv(backup_files.SLOW_FSYNC_ENV, str(SLOW_MS))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    worker = Backup(
        str(tmp_path / "backup"),
        tf.train.Checkpoint(v=tf.Variable(1.0)),
        is_chief=False,
        task_label="worker:1",
        asynchronous=True,
    )
    worker.save(Position(0, 3, 3))
    worker.wait()
    assert not list((tmp_path / "tmp").iterdir())
    assert not (tmp_path / "backup").exists()  # only the chief writes backup_dir


def test_fit_raises_a_failed_last_backup_at_its_end(tmp_path, monkeypatch):
    def disk_full(backup_dir, state):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(backup_files, "commit_state", disk_full)
    backup_dir = str(tmp_path / "b")
    trainer = _trainer(tfdist.BackupOptions(backup_dir))  # one save: at the epoch end
    with pytest.raises(RuntimeError, match=r"backup_dir='.*/b'.*No space left on device"):
        trainer.fit(DATA, epochs=1, global_batch_size=32, verbose=0)


@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_asynchronous_and_synchronous_backups_resume_alike(tmp_path, monkeypatch, strategy):
    # A slow disk: saves every update overlap the commits of the ones before.
    monkeypatch.setenv(backup_files.SLOW_FSYNC_ENV, "20")
    written = {}
    for asynchronous in (True, False):
        backup_dir = tmp_path / f"async-{asynchronous}"
        options = tfdist.BackupOptions(
            str(backup_dir), freq=1, keep_last=8, keep_after_success=True, asynchronous=asynchronous
        )
        trainer = _trainer(options, strategy)
        trainer.fit(DATA, epochs=2, global_batch_size=32, verbose=0)
        assert _state(backup_dir)["updates"] == 8
        written[asynchronous] = {
            (number, name): tf.train.load_variable(str(backup_dir / f"ckpt-{number}"), name)
            for number in range(1, 9)
            for name, _ in tf.train.list_variables(str(backup_dir / f"ckpt-{number}"))
            if name.startswith(("objects/", "position/"))  # not TF's own save_counter
        }
    # Each asynchronous backup holds the weights and position of its save call, although the
    # next update ran while it was written: bitwise those of the synchronous backup.
    assert written[True].keys() == written[False].keys()
    for key, value in written[False].items():
        np.testing.assert_array_equal(written[True][key], value, err_msg=str(key))


def test_the_asynchronous_option_is_checked():
    assert tfdist.BackupOptions("/tmp/unused").asynchronous is True
    with pytest.raises(
        ValueError, match=r"argument `asynchronous`. Received: asynchronous='no'.*True or False"
    ):
        tfdist.BackupOptions("/tmp/unused", asynchronous="no")


def test_a_dropped_backup_ends_its_writer(tmp_path):
    import gc
    import weakref

    variable = tf.Variable(1.0)
    backup = Backup(
        str(tmp_path), tf.train.Checkpoint(v=variable), is_chief=True, asynchronous=True
    )
    backup.save(Position(0, 1, 1))
    backup.wait()
    alive = weakref.ref(variable)
    del backup, variable
    gc.collect()
    assert alive() is None  # TF's writer (atexit holds it) no longer keeps the model alive
    assert os.path.exists(tmp_path / "state.json")


def test_a_process_exits_with_an_asynchronous_backup_still_alive(tmp_path):
    import subprocess
    import sys

    from tests.helpers import REPO

    code = (
        "import tensorflow as tf; from tfdist.training.backup.writer import Backup, Position; "
        f"b = Backup({str(tmp_path)!r}, tf.train.Checkpoint(v=tf.Variable(1.0)), "
        "is_chief=True, asynchronous=True); b.save(Position(0, 1, 1)); b.wait(); "
        "b.save(Position(0, 2, 2)); print('saved', flush=True)"
    )  # the second save is still in flight at exit: TF's exit hook finishes it
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and "saved" in proc.stdout, proc.stderr[-2000:]
    assert _state(tmp_path)["updates"] == 2
