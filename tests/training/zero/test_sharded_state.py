"""A sharded run's backups and .keras files hold whole tensors
(tfdist/training/zero/checkpoint.py).

One sharded run on mirrored x2 (Adam, ZeRO-1) writes a backup after its first epoch. The
same backup then resumes sharded on 4 replicas and on 1 (where sharding trains unsharded);
an unsharded asynchronous backup resumes sharded under ZeRO-2. Each run's weights equal an
uninterrupted unsharded run's, and the backups' keys and shapes are an unsharded run's. A kill
during a sharded multi-worker run, and a two-worker sharded backup resumed on one worker:
tests/training/backup/test_backup_faults.py. A weights-only file loads into a sharded Trainer with
Keras's warning.
"""

import json
import logging
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.jobs.common import builder, data, initial_weights

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
W0 = initial_weights()
XS, YS = data(48)


def _trainer(devices, sharding=None, backup=None):
    return tfdist.Trainer(
        builder(W0),
        strategy=tfdist.make_strategy("mirrored", num_devices=devices),
        optimizer=keras.optimizers.Adam(0.01),
        loss=LOSS,
        sharding=sharding,
        backup=backup,
    )


def _fit(trainer, epochs):
    trainer.fit(XS, YS, batch_size=16, epochs=epochs, steps_per_epoch=3, verbose=0)
    return trainer


def _gap(a, b):
    return max(float(np.max(np.abs(p - q))) for p, q in zip(a, b))


def _saved(backup_dir):
    """The optimizer's saved variables in a backup, by checkpoint key."""
    prefix = str(backup_dir / json.loads((backup_dir / "state.json").read_text())["checkpoint"])
    return {
        name: tf.train.load_variable(prefix, name)
        for name, _ in tf.train.list_variables(prefix)
        if name.startswith("objects/optimizer/")
    }


@pytest.fixture(scope="module")
def reference():
    """Unsharded mirrored x2, 2 epochs straight: its weights and optimizer variables."""
    trainer = _fit(_trainer(2), 2)
    return trainer.model.get_weights(), [v.numpy() for v in trainer.model.optimizer.variables]


def _backup(path, asynchronous=False):
    return tfdist.BackupOptions(path, keep_after_success=True, asynchronous=asynchronous)


def test_a_sharded_backup_is_whole_and_resumes_on_4_replicas_and_on_1(tmp_path, reference, caplog):
    want, _ = reference
    sharded_dir, plain_dir = tmp_path / "sharded", tmp_path / "plain"
    _fit(_trainer(2, "optimizer", _backup(sharded_dir)), 1)
    _fit(_trainer(2, None, _backup(plain_dir)), 1)
    sharded, plain = _saved(sharded_dir), _saved(plain_dir)
    assert sharded.keys() == plain.keys()
    assert {k: v.shape for k, v in sharded.items()} == {k: v.shape for k, v in plain.items()}
    assert _gap(sharded.values(), plain.values()) <= 1e-7

    on_four = _fit(_trainer(4, "optimizer", _backup(sharded_dir)), 2)
    assert _gap(on_four.model.get_weights(), want) <= 1e-6
    # Back the other way: the 4-replica run's backup on one device, where sharding (which
    # would only add a master copy of the parameters) trains unsharded, and says so.
    with caplog.at_level(logging.INFO, logger="tfdist.training.zero.state"):
        on_one = _fit(_trainer(1, "gradients", _backup(sharded_dir)), 2)
    assert "over 1 replica would hold more, not less" in caplog.text
    assert on_one.replica_bytes["master_shards"] == 0
    assert _gap(on_one.model.get_weights(), want) <= 1e-6


def test_an_unsharded_asynchronous_backup_resumes_sharded_and_keras_files_are_whole(
    tmp_path, reference
):
    want, want_slots = reference
    backup = _backup(tmp_path / "b", asynchronous=True)
    _fit(_trainer(2, None, backup), 1)
    resumed = _fit(_trainer(2, "gradients", backup), 2)
    assert _gap(resumed.model.get_weights(), want) <= 1e-7
    # Its last backup, written sharded and asynchronously, holds the unsharded run's slots.
    saved = _saved(tmp_path / "b")
    by_shape = sorted((v for v in saved.values() if v.ndim), key=lambda v: (v.shape, v.sum()))
    want_by_shape = sorted((v for v in want_slots if v.ndim), key=lambda v: (v.shape, v.sum()))
    assert _gap(by_shape, want_by_shape) <= 1e-6

    # model.save writes whole slots: load_model gives the unsharded run's optimizer state.
    path = str(tmp_path / "m.keras")
    resumed.model.save(path)
    loaded = keras.saving.load_model(path)
    assert _gap([v.numpy() for v in loaded.optimizer.variables], want_slots) <= 1e-6
    # And the sharded optimizer reads the file back, each replica taking its block.
    held = [v.numpy() for v in resumed.model.optimizer.variables]
    for v in resumed.model.optimizer.variables[2:]:
        v.assign(tf.zeros_like(v))
    resumed.model.load_weights(path)
    assert _gap([v.numpy() for v in resumed.model.optimizer.variables], held) == 0.0


def _load_recording_warnings(model, path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.load_weights(path)
    return [str(w.message) for w in caught]


def test_a_weights_only_file_loads_into_a_sharded_trainer_with_keras_warning(tmp_path):
    # An uncompiled model saves no optimizer state: Keras warns that it skips the optimizer's
    # variables and loads the weights; a sharded Trainer's optimizer does the same.
    path = str(tmp_path / "w.weights.h5")
    saved = builder()()
    saved.save_weights(path)
    plain = builder(W0)()
    plain.compile(optimizer=keras.optimizers.Adam(0.01, name="adam"), loss=LOSS)
    plain.fit(XS, YS, batch_size=16, epochs=1, steps_per_epoch=1, verbose=0)
    want = _load_recording_warnings(plain, path)

    trainer = tfdist.Trainer(
        builder(W0),
        strategy=tfdist.make_strategy("mirrored", num_devices=2),
        optimizer=keras.optimizers.Adam(0.01, name="adam"),
        loss=LOSS,
        sharding="optimizer",
    )
    trainer.fit(XS, YS, batch_size=16, epochs=1, steps_per_epoch=1, verbose=0)
    assert _load_recording_warnings(trainer.model, path) == want
    assert [m for m in want if m.startswith("Skipping variable loading for optimizer 'adam'")]
    assert _gap(trainer.model.get_weights(), saved.get_weights()) == 0.0
    assert _gap(plain.get_weights(), saved.get_weights()) == 0.0
