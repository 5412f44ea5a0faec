"""Backups in one process: SIGTERM without a backup, leftovers of killed writes, keep_backups,
fsync, gfile paths, and the chief's position winning on every worker."""

import json
import os
import signal

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.helpers import Crash
from tfdist.training.backup import files as backup_files
from tfdist.training.backup.writer import PROBE_PREFIX, Backup, Position, restore_on_every_worker

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
DATA = tfdist.data.load("synthetic", num_examples=128)  # 4 batches of 32


def _build():
    keras.utils.set_random_seed(5)
    return keras.Sequential(
        [keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(10)]
    )


def _trainer(backup_dir=None, **kwargs):
    return tfdist.Trainer(
        _build,
        strategy=tfdist.make_strategy("one_device"),
        optimizer=keras.optimizers.SGD(0.05),
        loss=LOSS,
        backup_dir=backup_dir,
        **kwargs,
    )


class SigtermAt(keras.callbacks.Callback):
    def __init__(self, at):
        super().__init__()
        self.at, self.seen = at, 0

    def on_train_batch_end(self, batch, logs=None):
        if self.seen == self.at:
            os.kill(os.getpid(), signal.SIGTERM)
        self.seen += 1


def test_sigterm_without_backup_stops_at_the_next_step_and_exits_143():
    trainer, probe = _trainer(), SigtermAt(5)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stopped:
        trainer.fit(DATA, epochs=40, global_batch_size=32, verbose=0, callbacks=[probe])
    assert stopped.value.code == 143
    assert (
        probe.seen == 6 and int(trainer.model.optimizer.iterations.numpy()) == 6
    )  # batch 5 was the last
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is put back


class SigtermInValidation(keras.callbacks.Callback):
    def on_test_begin(self, logs=None):
        os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_in_the_last_epochs_validation_still_stops_with_143():
    """The fit's last vote is after the last epoch's validation: a SIGTERM there stops the run
    (it finished, ran on and exited 0 before, seen on a GPT whose validation takes seconds)."""
    trainer = _trainer()
    with pytest.raises(SystemExit) as stopped:
        trainer.fit(
            DATA,
            epochs=1,
            global_batch_size=32,
            validation_data=DATA,
            verbose=0,
            callbacks=[SigtermInValidation()],
        )
    assert stopped.value.code == 143
    assert int(trainer.model.optimizer.iterations.numpy()) == 4  # the epoch's 4 updates


def test_sigterm_with_a_backup_saves_and_exits_75(tmp_path):
    trainer = _trainer(str(tmp_path / "b"))
    with pytest.raises(SystemExit) as stopped:
        trainer.fit(DATA, epochs=40, global_batch_size=32, verbose=0, callbacks=[SigtermAt(5)])
    assert stopped.value.code == 75
    state = Backup(str(tmp_path / "b"), None, is_chief=True).read_state()
    assert (state["epoch"], state["step"], state["updates"]) == (1, 2, 6)


def test_leftovers_of_killed_writes_do_not_break_the_cleanup(tmp_path):
    backup_dir = tmp_path / "b"
    first = _trainer(str(backup_dir), backup_freq=1)
    with pytest.raises(RuntimeError, match="simulated crash"):
        first.fit(DATA, epochs=2, global_batch_size=32, verbose=0, callbacks=[Crash(after=5)])
    # What kills in the middle of a write leave behind: TF's temporary shard
    # directory of the next checkpoint, and an uncommitted state file.
    state = json.loads((backup_dir / "state.json").read_text())
    part = backup_dir / f"ckpt-{state['number'] + 1}_temp" / "part-00000-of-00001"
    part.mkdir(parents=True)
    (part / "data").write_bytes(b"torn")
    (backup_dir / "state.json.tmp-4242").write_text("{")
    resumed = _trainer(str(backup_dir), backup_freq=1)
    resumed.fit(DATA, epochs=2, global_batch_size=32, verbose=0)
    assert int(resumed.model.optimizer.iterations.numpy()) == 8
    assert not backup_dir.exists()


def test_keep_backups_keeps_the_last_n(tmp_path):
    trainer = _trainer(str(tmp_path), backup_freq=1, keep_backup=True, keep_backups=3)
    trainer.fit(DATA, epochs=2, global_batch_size=32, verbose=0)  # 8 updates, one backup each
    indexes = sorted(p.name for p in tmp_path.glob("ckpt-*.index"))
    assert indexes == ["ckpt-6.index", "ckpt-7.index", "ckpt-8.index"]
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["checkpoint"] == "ckpt-8"
    assert [(k["checkpoint"], k["epoch"], k["step"], k["updates"]) for k in state["kept"]] == [
        ("ckpt-6", 1, 2, 6),
        ("ckpt-7", 1, 3, 7),
        ("ckpt-8", 2, 0, 8),
    ]


def test_keep_backups_error():
    with pytest.raises(
        ValueError, match="argument `keep_backups`. Received: keep_backups=0. Expected a positive"
    ):
        _trainer("/tmp/unused", keep_backups=0)


def test_the_commit_fsyncs_before_the_rename(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(
        backup_files, "fsync", lambda path: events.append(("fsync", os.path.basename(path)))
    )
    monkeypatch.setattr(
        os, "fsync", lambda fd: (events.append(("fsync", "tmp")), real_fsync(fd))[1]
    )
    monkeypatch.setattr(
        os,
        "replace",
        lambda a, b: (events.append(("rename", os.path.basename(b))), real_replace(a, b))[1],
    )
    backup = Backup(str(tmp_path), tf.train.Checkpoint(v=tf.Variable(1.0)), is_chief=True)
    backup.save(Position(0, 1, 1))
    rename = events.index(("rename", "state.json"))
    before = {name for _, name in events[:rename]}
    assert {"ckpt-1.index", "ckpt-1.data-00000-of-00001", "tmp", tmp_path.name} <= before, events
    assert events[rename + 1 :] == [
        ("fsync", tmp_path.name)
    ]  # the directory, so the rename is durable


def test_backup_dir_may_be_any_gfile_path():
    backup_dir = "ram://tfdist-test/backup"  # TF's in-memory filesystem: no fsync, gfile rename
    reference = _trainer()
    reference.fit(DATA, epochs=2, global_batch_size=32, verbose=0)
    with pytest.raises(RuntimeError, match="simulated crash"):
        _trainer(backup_dir, backup_freq=2).fit(
            DATA, epochs=2, global_batch_size=32, verbose=0, callbacks=[Crash(after=5)]
        )
    assert json.loads(tf.io.gfile.GFile(backup_dir + "/state.json").read())["updates"] == 4
    resumed = _trainer(backup_dir, backup_freq=2)
    resumed.fit(DATA, epochs=2, global_batch_size=32, verbose=0)
    for a, b in zip(reference.model.get_weights(), resumed.model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert not tf.io.gfile.exists(backup_dir)


def test_the_position_is_in_the_checkpoint(tmp_path):
    variable = tf.Variable(1.0)
    Backup(str(tmp_path), tf.train.Checkpoint(v=variable), is_chief=True).save(Position(2, 3, 40))
    assert "position/.ATTRIBUTES/py_state" in dict(
        tf.train.list_variables(str(tmp_path / "ckpt-1"))
    )
    # state.json's copy is for readers that do not open checkpoints; the restore reads the
    # checkpoint's.
    state = json.loads((tmp_path / "state.json").read_text())
    (tmp_path / "state.json").write_text(
        json.dumps({**state, "epoch": 9, "step": 9, "updates": 99})
    )
    variable.assign(0.0)
    assert Backup(
        str(tmp_path), tf.train.Checkpoint(v=variable), is_chief=True
    ).restore() == Position(2, 3, 40)
    assert float(variable.numpy()) == 1.0


def test_a_backup_with_its_position_in_state_json_only_still_restores(tmp_path):
    variable = tf.Variable(4.0)
    tf.train.Checkpoint(v=variable).write(
        str(tmp_path / "ckpt-1")
    )  # the format before the position moved in
    (tmp_path / "state.json").write_text(
        json.dumps(
            {"number": 1, "checkpoint": "ckpt-1", "epoch": 1, "step": 2, "updates": 7, "kept": []}
        )
    )
    variable.assign(0.0)
    assert Backup(
        str(tmp_path), tf.train.Checkpoint(v=variable), is_chief=True
    ).restore() == Position(1, 2, 7)
    assert float(variable.numpy()) == 4.0


class FakeSync:
    """One worker's view of the runner: the chief's broadcast values, and the others' votes."""

    def __init__(self, chief_values, others_disagree=False):
        self.chief_values, self.others_disagree = chief_values, others_disagree

    def broadcast(self, values):
        return list(self.chief_values if self.chief_values is not None else values)

    def agree(self, flag):
        return flag or self.others_disagree


def _two_checkpoints(backup_dir):
    variable = tf.Variable(0.0)
    backup = Backup(str(backup_dir), tf.train.Checkpoint(v=variable), is_chief=True, keep_backups=2)
    variable.assign(1.0)
    backup.save(Position(0, 3, 3))
    variable.assign(2.0)
    backup.save(Position(0, 6, 6))


def test_a_worker_restores_the_chiefs_position(tmp_path):
    _two_checkpoints(tmp_path)
    (tmp_path / f"{PROBE_PREFIX}77").write_text(
        "chief:0"
    )  # what the chief writes before broadcasting
    variable = tf.Variable(0.0)
    worker = Backup(
        str(tmp_path), tf.train.Checkpoint(v=variable), is_chief=False, task_label="worker:1"
    )
    # The worker's state.json says ckpt-2, but the chief read ckpt-1: the chief wins.
    position = worker.restore(FakeSync([77, 1, 0, 3, 3]))
    assert position == Position(0, 3, 3) and float(variable.numpy()) == 1.0


def test_a_backup_dir_the_workers_do_not_share_is_an_error_on_every_worker(tmp_path):
    _two_checkpoints(tmp_path / "chief")
    worker = Backup(
        str(tmp_path / "worker"),
        tf.train.Checkpoint(v=tf.Variable(0.0)),
        is_chief=False,
        task_label="worker:1",
    )
    with pytest.raises(
        ValueError,
        match=r"argument `backup_dir`.*The chief found checkpoint ckpt-2, but worker:1 "
        r"does not see the file the chief has just written there.*shared",
    ):
        worker.restore(FakeSync([77, 2, 0, 6, 6]))
    chief = Backup(str(tmp_path / "chief"), tf.train.Checkpoint(v=tf.Variable(0.0)), is_chief=True)
    with pytest.raises(ValueError, match="another worker does not see the chief's files there"):
        chief.restore(FakeSync(None, others_disagree=True))
    assert not list((tmp_path / "chief").glob(PROBE_PREFIX + "*"))  # the probe is removed


def test_a_backup_dir_on_some_workers_only_is_an_error_on_every_worker(tmp_path):
    mixed = FakeSync(
        None, others_disagree=True
    )  # the votes of a cluster where some workers have none
    with pytest.raises(
        ValueError, match=r"argument `backup_dir`. Received: backup_dir=None.*others none"
    ):
        restore_on_every_worker(None, mixed)
    chief = Backup(str(tmp_path), tf.train.Checkpoint(v=tf.Variable(0.0)), is_chief=True)
    with pytest.raises(ValueError, match="Some workers were given a backup_dir and others none"):
        restore_on_every_worker(chief, mixed)
    assert restore_on_every_worker(None, FakeSync(None)) is None
