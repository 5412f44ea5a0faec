"""Keras callbacks under the Trainer: files like Keras's, chief-only outputs, backups, refusals.

The numbers (weights, history) of each built-in callback are compared with plain Keras in
``tests/keras_parity/rows_callbacks.py``; this file checks what those rows cannot: the files
the callbacks write, what a non-chief worker does, the stop vote, and the refusals.
"""

import csv
import dataclasses
import glob
import os
import tempfile

import keras
import numpy as np
import pytest
import requests

import tfdist
from tests.helpers import Crash
from tests.keras_parity import rows_callbacks
from tests.keras_parity.parity import assert_same, run_keras, run_trainer
from tests.keras_parity.rows_basic import mlp, sgd_compile
from tfdist.training.fit.callback_mapping import resolve_callbacks
from tfdist.training.options import BackupOptions, LRScaling

_MIRRORED = []


def mirrored():
    if not _MIRRORED:
        _MIRRORED.append(tfdist.make_strategy("mirrored", num_devices=2))
    return _MIRRORED[0]


def _recording(row):
    """``row`` whose ``fit()`` also records the callbacks it made, one list per call."""
    made = []

    def fit():
        kwargs = row.fit()
        made.append(kwargs["callbacks"])
        return kwargs

    return dataclasses.replace(row, fit=fit), made


def _csv_rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def _weights_of(path):
    model = mlp()
    model.load_weights(path)
    return model.get_weights()


def _assert_close(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_written_files_match_keras():
    row = next(r for r in rows_callbacks.ROWS if r.name == "writers")
    row, made = _recording(row)
    assert_same(row, run_keras(row), run_trainer(row, mirrored()))
    (
        (k_ckpt, k_best, k_freq, k_csv, k_tb, k_backup, _),
        (t_ckpt, t_best, t_freq, t_csv, t_tb, *_),
    ) = made
    # CSVLogger: the same header and rows.
    want, got = _csv_rows(k_csv.filename), _csv_rows(t_csv.filename)
    assert list(got[0]) == list(want[0]) and len(got) == len(want) == 2
    for g, w in zip(got, want):
        np.testing.assert_allclose([float(v) for v in g.values()], [float(v) for v in w.values()])
    # ModelCheckpoint: the same files, holding the same weights; the full .keras models load.
    for k, t in ((k_ckpt, t_ckpt), (k_best, t_best), (k_freq, t_freq)):
        k_dir, t_dir = os.path.dirname(k.filepath), os.path.dirname(t.filepath)
        assert sorted(os.listdir(t_dir)) == sorted(os.listdir(k_dir)) != []
        for name in os.listdir(k_dir):
            if name.endswith(".weights.h5"):
                _assert_close(_weights_of(f"{t_dir}/{name}"), _weights_of(f"{k_dir}/{name}"))
    _assert_close(
        keras.saving.load_model(t_ckpt.filepath.format(epoch=2)).get_weights(),
        keras.saving.load_model(k_ckpt.filepath.format(epoch=2)).get_weights(),
    )
    # TensorBoard: train and validation events; BackupAndRestore: removed after success.
    for sub in ("train", "validation"):
        assert glob.glob(f"{t_tb.log_dir}/{sub}/events.out.tfevents.*")
    assert not os.path.exists(k_backup.backup_dir)


def test_tensorboard_profile_on_mirrored(tmp_path):
    train, _ = rows_callbacks._data()
    trainer = tfdist.Trainer(mlp, strategy=mirrored(), **sgd_compile())
    tensorboard = keras.callbacks.TensorBoard(
        str(tmp_path), update_freq="batch", profile_batch=(2, 3)
    )
    trainer.fit(train, epochs=1, verbose=0, callbacks=[tensorboard])
    assert glob.glob(f"{tmp_path}/train/plugins/profile/*/*.xplane.pb")
    assert glob.glob(f"{tmp_path}/train/events.out.tfevents.*")


def _posts(monkeypatch):
    posted = []
    monkeypatch.setattr(requests, "post", lambda url, *a, **k: posted.append((url, a, k)))
    return posted


def test_a_non_chief_worker_writes_nothing_and_cleans_up(monkeypatch, tmp_path):
    train, val = rows_callbacks._data()
    trainer = tfdist.Trainer(mlp, strategy=mirrored(), **sgd_compile())
    monkeypatch.setattr(trainer.runner, "_is_chief", False)  # as worker 1 of a multi-worker run
    posted = _posts(monkeypatch)
    made, mkdtemp = [], tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp", lambda **kw: made.append(mkdtemp(**kw)) or made[-1])
    callbacks = [
        keras.callbacks.ModelCheckpoint(str(tmp_path / "ckpt" / "m-{epoch}.keras")),
        keras.callbacks.ModelCheckpoint(str(tmp_path / "w.weights.h5"), save_weights_only=True),
        keras.callbacks.CSVLogger(str(tmp_path / "log.csv")),
        keras.callbacks.TensorBoard(str(tmp_path / "tb"), update_freq="batch", profile_batch=2),
        keras.callbacks.RemoteMonitor(root="http://monitor.invalid"),
        keras.callbacks.ProgbarLogger(),
    ]
    history = trainer.fit(train, validation_data=val, epochs=2, verbose=0, callbacks=callbacks)
    assert len(history.history["loss"]) == 2
    assert os.listdir(tmp_path) == [] and posted == []
    ours = [d for d in made if os.path.basename(d).startswith("tfdist-")]
    assert ours and not any(os.path.exists(d) for d in ours)  # its temporary outputs removed
    assert callbacks[2].filename == str(tmp_path / "log.csv")  # paths given back


def test_remote_monitor_posts_from_the_chief(monkeypatch):
    train, _ = rows_callbacks._data()
    trainer = tfdist.Trainer(mlp, strategy=mirrored(), **sgd_compile())
    posted = _posts(monkeypatch)
    monitor = keras.callbacks.RemoteMonitor(root="http://monitor.invalid", send_as_json=True)
    history = trainer.fit(train, epochs=2, verbose=0, callbacks=[monitor])
    assert [p[0] for p in posted] == ["http://monitor.invalid/publish/epoch/end/"] * 2
    assert posted[1][2]["json"]["loss"] == pytest.approx(history.history["loss"][1])


class _OtherWorkerStops(keras.callbacks.Callback):
    """``runner.agree_each`` as if another worker's callback set ``stop_training`` by training
    vote n; counts the loop's votes."""

    def __init__(self, agree_each, n):
        super().__init__()
        self.agree_each, self.n, self.votes = agree_each, n, None

    def on_train_begin(self, logs=None):
        self.votes = 0  # count the loop's votes only, not those of the setup

    def __call__(self, flags):
        if self.votes is not None:
            self.votes += 1
        stop, *rest = self.agree_each(flags)
        return (stop or self.votes == self.n, *rest)


class _OtherWorkerStopsWithEpochBegin(_OtherWorkerStops):
    """The same, with an ``on_epoch_begin`` of its own: a user's callback that may stop there."""

    def on_epoch_begin(self, epoch, logs=None):
        pass


@pytest.mark.parametrize(
    "vote, steps_per_execution, epochs, updates",
    [(2, 1, 1, 1), (2, 32, 1, 6), (3, 32, 2, 7)],
    ids=["after_a_call", "at_epoch_end", "at_epoch_begin"],
)
def test_a_stop_on_any_worker_stops_every_worker(
    monkeypatch, vote, steps_per_execution, epochs, updates
):
    # With a callback that may stop in on_epoch_begin, the loop votes at each epoch's begin and
    # end and between its calls (6 batches: one call of 32, or 6 of 1), not after its last
    # call. A stop at an epoch's begin still trains one update, as Keras's fit.
    train, _ = rows_callbacks._data()
    trainer = tfdist.Trainer(
        mlp, strategy=mirrored(), steps_per_execution=steps_per_execution, **sgd_compile()
    )
    other = _OtherWorkerStopsWithEpochBegin(trainer.runner.agree_each, vote)
    monkeypatch.setattr(trainer.runner, "agree_each", other)
    history = trainer.fit(train, epochs=3, verbose=0, callbacks=[other])
    assert len(history.history["loss"]) == epochs
    assert trainer.model.stop_training
    assert int(trainer.model.optimizer.iterations.numpy()) == updates


@pytest.mark.parametrize("epoch_begin, votes", [(False, 1 + 3), (True, 2 * 3)])
def test_one_call_epochs_vote_once_an_epoch(monkeypatch, epoch_begin, votes):
    # At each epoch's end, in one collective (every flag): not after the epoch's last call,
    # whose stop the epoch-end vote takes, nor at its start but the fit's first, unless a
    # callback may stop in on_epoch_begin (the epoch-end vote carries that too).
    train, _ = rows_callbacks._data()
    trainer = tfdist.Trainer(mlp, strategy=mirrored(), steps_per_execution=32, **sgd_compile())
    kind = _OtherWorkerStopsWithEpochBegin if epoch_begin else _OtherWorkerStops
    other = kind(trainer.runner.agree_each, 0)  # never stops
    monkeypatch.setattr(trainer.runner, "agree_each", other)
    keras_callbacks = [keras.callbacks.EarlyStopping(patience=5), keras.callbacks.History()]
    trainer.fit(train, epochs=3, verbose=0, callbacks=[other, *keras_callbacks])
    assert other.votes == votes


@pytest.mark.slow
def test_keras_backup_and_restore_resumes_at_the_exact_batch(tmp_path):
    train, _ = rows_callbacks._data()
    reference = tfdist.Trainer(mlp, strategy=mirrored(), **sgd_compile())
    reference.fit(train, epochs=2, verbose=0)
    backup_dir = str(tmp_path / "backup")

    def backup():
        return keras.callbacks.BackupAndRestore(backup_dir, save_freq=2)

    first = tfdist.Trainer(mlp, strategy=mirrored(), **sgd_compile())
    with pytest.raises(RuntimeError, match="simulated crash"):
        first.fit(train, epochs=2, verbose=0, callbacks=[backup(), Crash(after=8)])
    assert os.path.exists(f"{backup_dir}/state.json")
    resumed = tfdist.Trainer(mlp, strategy=mirrored(), **sgd_compile())
    history = resumed.fit(train, epochs=2, verbose=0, callbacks=[backup()])
    assert len(history.history["loss"]) == 1  # epoch 2 only, from its 3rd batch
    assert int(resumed.model.optimizer.iterations.numpy()) == 12
    _assert_close(resumed.model.get_weights(), reference.model.get_weights())
    assert not os.path.exists(backup_dir)  # delete_checkpoint=True


def test_backup_callbacks_map_onto_backup_options(tmp_path):
    keras_backup = keras.callbacks.BackupAndRestore(
        str(tmp_path), save_freq=8, double_checkpoint=True, delete_checkpoint=False
    )
    resolved = resolve_callbacks(
        [keras_backup, keras.callbacks.History()],
        backup=None,
        lr_scaling=None,
        accumulation_steps=4,
    )
    assert resolved.backup == BackupOptions(
        str(tmp_path), freq=2, keep_last=2, keep_after_success=True
    )
    assert [type(c) for c in resolved.callbacks] == [keras.callbacks.History]
    ours = tfdist.callbacks.BackupAndRestore(str(tmp_path), save_freq=5, keep_backups=3)
    resolved = resolve_callbacks([ours], backup=None, lr_scaling=None, accumulation_steps=1)
    assert resolved.backup == BackupOptions(str(tmp_path), freq=5, keep_last=3)
    assert resolved.callbacks == ()


def _orbax():
    # OrbaxCheckpoint's constructor needs the orbax package; the refusal looks only at the type.
    return object.__new__(keras.callbacks.OrbaxCheckpoint)


@pytest.mark.parametrize(
    "make_callbacks, options, pattern",
    [
        (
            lambda d: [keras.callbacks.BackupAndRestore(d)],
            dict(backup=BackupOptions("/tmp/b")),
            r"no BackupAndRestore when the Trainer has `backup`",
        ),
        (
            lambda d: [keras.callbacks.BackupAndRestore(d), tfdist.callbacks.BackupAndRestore(d)],
            {},
            r"at most one BackupAndRestore",
        ),
        (
            lambda d: [keras.callbacks.BackupAndRestore(d, save_freq=3)],
            dict(accumulation_steps=2),
            r"save_freq=3.*multiple of accumulation_steps=2",
        ),
        (lambda d: [keras.callbacks.BackupAndRestore(d, save_freq=False)], {}, r"save_freq=False"),
        (
            lambda d: [keras.callbacks.ReduceLROnPlateau()],
            dict(lr_scaling=LRScaling("linear")),
            r"callbacks=\['ReduceLROnPlateau'\].*lr_scaling='linear'",
        ),
        (
            lambda d: [keras.callbacks.LearningRateScheduler(lambda e, lr: lr)],
            dict(lr_scaling=LRScaling("none", warmup_steps=10)),
            r"callbacks=\['LearningRateScheduler'\].*warmup_steps=10",
        ),
        (lambda d: [_orbax()], {}, r"OrbaxCheckpoint coordinates JAX hosts.*ModelCheckpoint"),
    ],
    ids=[
        "trainer_backup",
        "two_backups",
        "accumulation",
        "save_freq_false",
        "rlrop",
        "lrs",
        "orbax",
    ],
)
def test_refused_callbacks(tmp_path, make_callbacks, options, pattern):
    kwargs = dict(backup=None, lr_scaling=None, accumulation_steps=1) | options
    with pytest.raises(ValueError, match=pattern):
        resolve_callbacks(make_callbacks(str(tmp_path)), **kwargs)


def test_a_keras_written_backup_is_not_trained_over(tmp_path):
    (tmp_path / "training_metadata.json").write_text("{}")
    with pytest.raises(ValueError, match="holds training_metadata.json"):
        resolve_callbacks(
            [keras.callbacks.BackupAndRestore(str(tmp_path))],
            backup=None,
            lr_scaling=None,
            accumulation_steps=1,
        )


def test_the_trainer_refuses_before_training():
    train, _ = rows_callbacks._data()
    trainer = tfdist.Trainer(mlp, strategy=mirrored(), lr_scaling="linear", **sgd_compile())
    with pytest.raises(ValueError, match=r"callbacks=\['ReduceLROnPlateau'\]"):
        trainer.fit(train, callbacks=[keras.callbacks.ReduceLROnPlateau()])
    assert int(trainer.model.optimizer.iterations.numpy()) == 0


def test_batch_logs_count_as_read_only_where_a_callback_can_read_them():
    """A fit keeps no batch logs only when no callback has a batch-end hook to receive them."""
    from tfdist.training.fit.chief_only import FitCallbackList

    class EpochOnly(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            pass

    class BatchEnd(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            pass

    class OldBatchEnd(keras.callbacks.Callback):
        def on_batch_end(self, batch, logs=None):
            pass

    patched = keras.callbacks.Callback()
    patched.on_train_batch_end = lambda batch, logs=None: None

    def reads(callbacks, verbose=0):
        return FitCallbackList(
            callbacks,
            add_history=True,
            add_progbar=bool(verbose),
            verbose=verbose,
            epochs=1,
            steps=4,
        ).reads_batch_logs

    assert not reads([]) and not reads([EpochOnly(), keras.callbacks.Callback()])
    assert not reads([], verbose=2)  # the progress bar shows batch logs at verbose=1 only
    assert reads([], verbose=1)
    for callback in (BatchEnd(), OldBatchEnd(), patched, keras.callbacks.TerminateOnNaN()):
        assert reads([EpochOnly(), callback]), callback


def test_the_progress_bar_reads_a_batchs_logs_only_when_it_draws_them(capsys):
    """verbose=1 under parameter servers: each read waits for its call, so only drawn ones."""
    import time

    from tfdist.logs import LazyLogs
    from tfdist.training.fit.chief_only import FitCallbackList

    callbacks = FitCallbackList([], add_progbar=True, verbose=1, epochs=1, steps=400)
    callbacks.on_train_begin()
    callbacks.on_epoch_begin(0)
    read = []

    def logs(batch):
        return LazyLogs(["loss"], lambda: read.append(batch) or {"loss": 1000.0 + batch})

    for batch in range(199):  # well within the bar's 0.05 s between draws
        callbacks.on_train_batch_end(batch, logs(batch))
    time.sleep(0.06)
    callbacks.on_train_batch_end(199, logs(199))  # due: drawn with its own values
    for batch in range(200, 400):  # the epoch's last batch always draws
        callbacks.on_train_batch_end(batch, logs(batch))
    callbacks.on_epoch_end(0, {"loss": 0.5})
    assert read[:2] == [0, 199] and read[-1] == 399 and len(read) < 10, read
    shown = capsys.readouterr().out
    assert "1199.0000" in shown and "400/400" in shown and "loss: 0.5000" in shown
