"""Backups under ``sharding="parameters"`` (ZeRO-3) hold the weights and the optimizer slots
whole, in an unsharded run's format (tfdist/training/zero/parameters.py ``in_checkpoint``,
tfdist/training/backup/writer.py ``checkpoint_for``); mirrored on logical CPU devices.

Adam, the MLP of test_parameters.py (BatchNormalization, regularizers, a constraint): a
``"parameters"`` run on 2 replicas gets SIGTERM in its second epoch, saves (the preemption
path, asynchronous) and exits 75. Its backup resumes sharded on 2 replicas (through Keras's
``BackupAndRestore`` callback, which becomes the Trainer's backup) bitwise as an uninterrupted
``"parameters"`` run, and unsharded to 1e-6 (on 2 replicas: BatchNormalization's statistics are
per replica, so another count trains another model). SGD, a small transformer-like model
(Embedding, Dense over 3-D input, a residual block with LayerNormalization): an unsharded
backup of 2 replicas resumes sharded on 3 (padded blocks) as the unsharded run goes on, to
1e-6 (its small variables kept whole, ``keep_whole_below``), and the sharded run's own last
backup (synchronous) has the unsharded one's keys and shapes and its whole weights. A kill of a
real multi-worker run with a backup: tests/training/backup/test_backup_faults.py (ZeRO-1/2's
sharded slots, the same ``WholeTensor`` mechanism).
"""

import itertools
import json
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.training.backup.test_backup_robustness import SigtermAt
from tests.training.zero.test_parameters import LOSS, G, _data, _mlp, _with


def _trainer(build, weights, optimizer, sharding, replicas, **options):
    return tfdist.Trainer(
        lambda: _with(build(), weights),
        strategy=tfdist.make_strategy("mirrored", num_devices=replicas),
        optimizer=optimizer,
        loss=LOSS,
        sharding=sharding,
        **options,
    )


def _fit(trainer, x, y, epochs, **kwargs):
    trainer.fit(x, y, batch_size=G, epochs=epochs, shuffle=False, verbose=0, **kwargs)
    return trainer.model.get_weights()


def _gap(a, b):
    return max(float(np.max(np.abs(p - q))) for p, q in zip(a, b, strict=True))


def _saved(backup_dir):
    """The last committed backup's tensors, by checkpoint key (the position left out)."""
    state = json.loads((backup_dir / "state.json").read_text())
    prefix = str(backup_dir / state["checkpoint"])
    return {
        name: tf.train.load_variable(prefix, name)
        for name, _ in tf.train.list_variables(prefix)
        if name.startswith("objects/")
    }


def _model_tensors(saved):
    """The model's variables in a backup, in the model's order."""
    keys = (f"objects/model/{i}/.ATTRIBUTES/VARIABLE_VALUE" for i in itertools.count())
    return [saved[key] for key in itertools.takewhile(saved.__contains__, keys)]


def test_a_sigterm_backup_of_sharded_parameters_resumes_sharded_bitwise_and_unsharded(tmp_path):
    weights = _mlp().get_weights()
    x, y = _data(_mlp())
    adam = lambda: keras.optimizers.Adam(0.01)  # noqa: E731
    backup = tmp_path / "b"
    killed = _trainer(_mlp, weights, adam(), "parameters", 2, backup_dir=str(backup))
    with pytest.raises(SystemExit) as stopped:  # 3 updates an epoch: SIGTERM after the 4th
        _fit(killed, x, y, 2, callbacks=[SigtermAt(3)])
    assert stopped.value.code == 75
    state = json.loads((backup / "state.json").read_text())
    assert (state["epoch"], state["step"], state["updates"]) == (1, 1, 4)
    assert [t.shape for t in _model_tensors(_saved(backup))] == [w.shape for w in weights]
    shutil.copytree(backup, tmp_path / "copy")

    want = _fit(_trainer(_mlp, weights, adam(), "parameters", 2), x, y, 2)
    resumed = _trainer(_mlp, weights, adam(), "parameters", 2)
    got = _fit(resumed, x, y, 2, callbacks=[keras.callbacks.BackupAndRestore(str(backup))])
    assert _gap(got, want) == 0.0
    assert _gap(want, weights) > 1e-3  # the runs train
    # Unsharded on the same count (BatchNormalization's statistics are per replica).
    plain = _trainer(_mlp, weights, adam(), None, 2, backup_dir=str(tmp_path / "copy"))
    assert _gap(_fit(plain, x, y, 2), want) <= 1e-6
    assert int(plain.model.optimizer.iterations.numpy()) == 6


def _transformer():
    tokens = keras.Input((4,), dtype="int32")
    h = keras.layers.Embedding(11, 8)(tokens)
    h = keras.layers.Dense(8)(h)  # over [batch, 4, 8]
    f = keras.layers.Dense(8, activation="gelu")(keras.layers.Dense(16)(h))
    h = keras.layers.LayerNormalization()(keras.layers.Add()([h, f]))  # a residual block
    return keras.Model(tokens, keras.layers.Dense(3)(keras.layers.GlobalAveragePooling1D()(h)))


def test_an_unsharded_backup_resumes_as_sharded_parameters_on_3_replicas(tmp_path):
    weights = _transformer().get_weights()
    rng = np.random.default_rng(1)
    x = rng.integers(0, 11, size=(3 * G, 4)).astype("int32")
    y = rng.integers(0, 3, size=(3 * G,)).astype("int32")
    sgd = lambda: keras.optimizers.SGD(0.1)  # noqa: E731
    plain_dir, sharded_dir = tmp_path / "plain", tmp_path / "sharded"
    keep = {"keep_after_success": True}
    backup = tfdist.BackupOptions(plain_dir, **keep)
    plain = _trainer(_transformer, weights, sgd(), None, 2, backup=backup)
    _fit(plain, x, y, 1)
    shutil.copytree(plain_dir, sharded_dir)
    want = _fit(plain, x, y, 2)  # the same run goes on from its backup: its second epoch

    backup = tfdist.BackupOptions(sharded_dir, asynchronous=False, **keep)
    # Its biases and LayerNormalization's scales kept whole (fewer than 9 elements).
    sharded = _trainer(
        _transformer, weights, sgd(), "parameters", 3, backup=backup, keep_whole_below=9
    )
    got = _fit(sharded, x, y, 2)
    assert _gap(got, want) <= 1e-6
    assert _gap(want, weights) > 1e-3
    # Its last backup, written from blocks of 3 replicas: the unsharded run's format, whole.
    mine, theirs = _saved(sharded_dir), _saved(plain_dir)
    assert {k: v.shape for k, v in mine.items()} == {k: v.shape for k, v in theirs.items()}
    whole = [v.numpy() for v in sharded.model.variables]
    assert _gap(_model_tensors(mine), whole) == 0.0
