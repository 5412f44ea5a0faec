"""Local SGD and DiLoCo in one process: two mirrored replicas as two workers, or one device.

The 2-worker ``multi_worker`` checks (sync_every=1 against synchronous training, bitwise equal
workers after each sync, the collectives) share ``tests/strategies/test_multi_worker.py``'s
launch.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.jobs.common import GLOBAL_BATCH, builder, data
from tests.training.local_sgd.common import LOSS, W0, dataset, with_batch_norm


def _fit(strategy, local_sgd=None, optimizer=None, model=None, callbacks=None, **kwargs):
    trainer = tfdist.Trainer(
        model or builder(W0),
        strategy=strategy,
        optimizer=optimizer or keras.optimizers.SGD(0.1),
        loss=LOSS,
        local_sgd=local_sgd,
        **kwargs,
    )
    history = trainer.fit(dataset(), epochs=2, verbose=0, callbacks=callbacks)
    return trainer, history.history


def _copies(trainer, variable):
    """Each replica's copy of ``variable``."""
    value = getattr(variable, "value", variable)
    return [c.numpy() for c in trainer.strategy.experimental_local_results(value)]


def test_sync_every_update_equals_synchronous_training(mirrored):
    """sync_every=1, plain averaging, SGD: the replicas' mean of their own steps is the step on
    the mean gradient (to 1e-6); every update is a sync."""
    reference, _ = _fit(mirrored)
    local, history = _fit(mirrored, tfdist.LocalSGDOptions(sync_every=1))
    for a, b in zip(reference.model.get_weights(), local.model.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
    assert history["syncs"] == [6.0, 12.0]


@pytest.mark.parametrize("optimizer", [keras.optimizers.SGD, keras.optimizers.Adam])
def test_one_replica_equals_plain_training(optimizer):
    one = tfdist.make_strategy("one_device")
    reference, _ = _fit(one, optimizer=optimizer(0.05))
    local, _ = _fit(one, tfdist.LocalSGDOptions(sync_every=3), optimizer=optimizer(0.05))
    for a, b in zip(reference.model.get_weights(), local.model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_replicas_equal_bitwise_after_a_sync_and_their_own_between(mirrored):
    """12 updates: sync_every=4 ends on a sync, every replica's parameters and BatchNorm moving
    statistics the same bits; Adam's moments stay each replica's own."""
    keras.utils.set_random_seed(1)
    model = with_batch_norm()
    trainer, history = _fit(
        mirrored, tfdist.LocalSGDOptions(4), keras.optimizers.Adam(0.01), model=model
    )
    assert history["syncs"] == [1.0, 3.0]
    averaged = trainer.model.trainable_variables + trainer.model.non_trainable_variables
    for v in averaged:
        first, second = _copies(trainer, v)
        np.testing.assert_array_equal(first, second, err_msg=v.path)
    moments = [v for v in trainer.model.optimizer.variables if "momentum" in v.path]
    assert moments and all(
        not np.array_equal(*_copies(trainer, v)) for v in moments
    )  # the inner optimizer's state is not averaged


class _Copies(keras.callbacks.Callback):
    """Each replica's copy of each weight at the last epoch's end (before fit's last sync)."""

    def __init__(self, trainer):
        super().__init__()
        self.trainer = trainer

    def on_epoch_end(self, epoch, logs=None):
        self.copies = [_copies(self.trainer, v) for v in self.trainer.model.trainable_variables]


def test_fit_ends_on_a_sync_of_the_partial_round_and_validation_sees_each_replicas_copy(mirrored):
    """6 updates with sync_every=4: at the epoch's end (2 updates into a round) the replicas
    differ, and validation evaluates each replica's own copy on its half of each batch (the
    logged val_loss is their mean); fit then syncs the partial round, so every replica holds
    the same bits, the replicas' mean."""
    x, y = data(32, seed=3)
    trainer = tfdist.Trainer(
        builder(W0),
        strategy=mirrored,
        optimizer=keras.optimizers.SGD(0.1),
        loss=LOSS,
        local_sgd=tfdist.LocalSGDOptions(4),
    )
    spy = _Copies(trainer)
    history = trainer.fit(dataset(), epochs=1, verbose=0, callbacks=[spy], validation_data=(x, y))
    assert history.history["syncs"] == [1.0]
    first, second = spy.copies[0]
    assert np.abs(first - second).max() > 1e-3  # the epoch ended mid-round
    losses = []
    for replica in range(2):  # each global batch of 16: the first 8 rows to replica 0
        model = builder([c[replica] for c in spy.copies])()
        rows = [slice(i, i + 8) for i in range(8 * replica, 32, 16)]
        losses += [LOSS(y[r], model(x[r])).numpy() for r in rows]
    np.testing.assert_allclose(history.history["val_loss"][0], np.mean(losses), rtol=1e-5)
    for v, (a, b) in zip(trainer.model.trainable_variables, spy.copies):
        for copy in _copies(trainer, v):
            np.testing.assert_array_equal(copy, (a + b) / np.float32(2), err_msg=v.path)


def test_steps_per_execution_does_not_move_the_syncs(mirrored):
    one_per_call, _ = _fit(mirrored, tfdist.LocalSGDOptions(4), steps_per_execution=1)
    five_per_call, _ = _fit(mirrored, tfdist.LocalSGDOptions(4), steps_per_execution=5)
    for a, b in zip(one_per_call.model.get_weights(), five_per_call.model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_diloco_applies_the_averaged_change_with_the_outer_optimizer():
    """One replica, sync_every=2, inner SGD(0.1), outer SGD(0.5): each round starts from the
    last synced weights w, trains 2 updates to x, and ends at w + 0.5 (x - w) (plain Keras fit
    on one device, by hand)."""
    outer = tfdist.LocalSGDOptions(2, outer_optimizer=keras.optimizers.SGD(0.5))
    local, _ = _fit(tfdist.make_strategy("one_device"), outer)
    model = builder(W0)()
    model.compile(keras.optimizers.SGD(0.1), LOSS)
    synced = [np.array(w) for w in W0]
    batches = list(dataset()) * 2  # 2 epochs: 6 rounds of 2 updates
    for r in range(6):
        model.set_weights(synced)
        for x, y in batches[2 * r : 2 * r + 2]:
            model.train_on_batch(x, y)
        synced = [w + 0.5 * (x - w) for w, x in zip(synced, model.get_weights())]
    for a, b in zip(synced, local.model.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)


def test_diloco_with_an_outer_step_of_one_is_plain_averaging(mirrored):
    """Outer SGD(1.0) moves the last synced weights by the whole averaged change: the mean;
    with gradient_compression="bf16" that change travels in 16 bits (to 2e-3, not the same)."""
    plain, _ = _fit(mirrored, tfdist.LocalSGDOptions(3))
    outer = tfdist.LocalSGDOptions(3, outer_optimizer=keras.optimizers.SGD(1.0))
    diloco, _ = _fit(mirrored, outer)
    for a, b in zip(plain.model.get_weights(), diloco.model.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
    outer = tfdist.LocalSGDOptions(3, outer_optimizer=keras.optimizers.SGD(1.0))
    bf16, _ = _fit(mirrored, outer, gradient_compression="bf16")
    gaps = [
        np.abs(a - b).max() for a, b in zip(plain.model.get_weights(), bf16.model.get_weights())
    ]
    assert 0 < max(gaps) < 2e-3, gaps


class _Crash(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) == 7:
            raise RuntimeError("simulated crash")


def test_a_backup_holds_the_outer_state_and_resumes_mid_round_bitwise(tmp_path):
    """One replica, DiLoCo (Adam inside, Nesterov outside), sync_every=4, a backup every 2
    updates: a crash after update 7 resumes from update 6, mid-round (the last synced weights,
    those of update 4, and the outer momentum come from the backup), and ends bitwise where an
    uninterrupted run ends."""
    one = tfdist.make_strategy("one_device")

    def fit(callbacks=None, **backup):
        outer = keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True)
        trainer, history = _fit(
            one,
            tfdist.LocalSGDOptions(4, outer_optimizer=outer),
            keras.optimizers.Adam(0.01),
            steps_per_execution=1,
            callbacks=callbacks,
            **backup,
        )
        return trainer.model.get_weights(), history

    reference, _ = fit()
    backup = {"backup_dir": str(tmp_path / "backup"), "backup_freq": 2}
    with pytest.raises(RuntimeError, match="simulated crash"):
        fit([_Crash()], **backup)
    resumed, history = fit(**backup)
    assert history["syncs"][-1] == 3.0
    for a, b in zip(reference, resumed):
        np.testing.assert_array_equal(a, b)


def test_a_masked_loss_takes_each_replicas_own_mean_between_syncs(mirrored):
    """ignore_class=0, sync_every=2: after the first update (no sync) each replica's copy is
    where Keras's train_on_batch on that replica's half of the batch puts it (the mean over
    its own valid labels, not over the global batch's: no all-reduce of the counts)."""
    masked = keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0)
    x, y = data()
    assert np.sum(y[:8] != 0) != np.sum(y[8:16] != 0)  # the halves' valid counts differ
    trainer = tfdist.Trainer(
        builder(W0),
        strategy=mirrored,
        optimizer=keras.optimizers.SGD(0.1),
        loss=masked,
        local_sgd=tfdist.LocalSGDOptions(2),
        steps_per_execution=1,
    )
    spy = _Copies(trainer)
    fit = {"batch_size": GLOBAL_BATCH, "epochs": 1, "verbose": 0, "shuffle": False}
    trainer.fit(x[:16], y[:16], callbacks=[spy], **fit)
    for replica, rows in enumerate((slice(0, 8), slice(8, 16))):
        model = builder(W0)()
        model.compile(keras.optimizers.SGD(0.1), masked)
        model.train_on_batch(x[rows], y[rows])
        for expected, copies in zip(model.get_weights(), spy.copies):
            np.testing.assert_allclose(copies[replica], expected, atol=1e-6, rtol=0)


class _At(keras.callbacks.Callback):
    """Each replica's copy of the trainable weights and the inner slots after update ``at``."""

    def __init__(self, trainer, at):
        super().__init__()
        self.trainer, self.at = trainer, at

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) == self.at:
            model = self.trainer.model
            self.weights = [_copies(self.trainer, v) for v in model.trainable_variables]
            self.slots = [_copies(self.trainer, v) for v in _slots(model.optimizer)]


def _slots(optimizer):
    return [v for v in optimizer.variables if "momentum" in v.path or "velocity" in v.path]


def _rows(prefix, group):
    """The row counts of the backup's per-replica copies of ``group``."""
    return [
        shape[0]
        for name, shape in tf.train.list_variables(str(prefix))
        if f"local_sgd/replicas/{group}/" in name
    ]


def test_a_backup_resumes_every_replicas_own_state_mid_round_bitwise(mirrored, tmp_path):
    """Two replicas, DiLoCo (Adam inside, Nesterov outside), BatchNorm, sync_every=4, a backup
    every 2 updates: a crash after update 7 resumes from update 6, mid-round, each replica
    taking back its own parameters, moving statistics and Adam moments (which differ between
    syncs), and ends bitwise where an uninterrupted run ends. The backup of update 4 (right
    after a sync) holds the parameters once: their per-replica copies have no rows, the
    never-averaged moments two; the backup of update 6 two rows of each."""

    def fit(callbacks=None, **backup):
        keras.utils.set_random_seed(1)
        outer = keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True)
        trainer, history = _fit(
            mirrored,
            tfdist.LocalSGDOptions(4, outer_optimizer=outer),
            keras.optimizers.Adam(0.01),
            model=with_batch_norm(),
            steps_per_execution=1,
            callbacks=callbacks,
            **backup,
        )
        return trainer.model.get_weights(), history

    reference, _ = fit()
    backup_dir = tmp_path / "backup"
    backup = {"backup": tfdist.BackupOptions(str(backup_dir), freq=2, keep_last=2)}
    with pytest.raises(RuntimeError, match="simulated crash"):
        fit([_Crash()], **backup)
    at_sync, mid_round = (backup_dir / f"ckpt-{n}" for n in (2, 3))  # updates 4 and 6
    assert set(_rows(at_sync, "parameters") + _rows(at_sync, "statistics")) == {0}
    assert set(_rows(at_sync, "slots")) == {2}
    for group in ("parameters", "statistics", "slots"):
        assert set(_rows(mid_round, group)) == {2}, group
    resumed, history = fit(**backup)
    assert history["syncs"][-1] == 3.0
    for a, b in zip(reference, resumed):
        np.testing.assert_array_equal(a, b)


class _Begin(keras.callbacks.Callback):
    """The weights and the inner slots at the fit's start (after a restore)."""

    def on_train_begin(self, logs=None):
        self.weights = [v.numpy() for v in self.model.trainable_variables]
        self.slots = [v.numpy() for v in _slots(self.model.optimizer)]


@pytest.mark.parametrize("outer", [None, 1.0], ids=["averaging", "diloco"])
def test_a_two_replica_backup_resumes_on_one_replica_with_the_partial_round_synced(
    mirrored, tmp_path, caplog, outer
):
    """Elastic resume: a 2-replica backup taken mid-round (update 6 of sync_every=4, Adam
    inside) resumes on one device with the partial round synced, as a fit's end syncs it: the
    parameters are the replicas' mean (bitwise; with DiLoCo's outer SGD(1.0), the last synced
    parameters minus the mean change, to 1e-6), Adam's moments replica 0's; the run goes on to
    its 12 updates with syncs at 8 and 12."""
    backup = {"backup_dir": str(tmp_path / "backup"), "backup_freq": 2}
    outer_optimizer = None if outer is None else keras.optimizers.SGD(outer)
    options = tfdist.LocalSGDOptions(4, outer_optimizer=outer_optimizer)
    trainer = tfdist.Trainer(
        builder(W0), strategy=mirrored, optimizer=keras.optimizers.Adam(0.01), loss=LOSS,
        local_sgd=options, steps_per_execution=1, **backup,
    )  # fmt: skip
    spy = _At(trainer, 6)
    with pytest.raises(RuntimeError, match="simulated crash"):
        trainer.fit(dataset(), epochs=2, verbose=0, callbacks=[spy, _Crash()])
    begin = _Begin()
    with caplog.at_level("WARNING", logger="tfdist.training.backup.fit_backups"):
        _, history = _fit(
            tfdist.make_strategy("one_device"), options, keras.optimizers.Adam(0.01),
            callbacks=[begin], steps_per_execution=1, **backup,
        )  # fmt: skip
    assert "a backup of 2 replicas resumes on 1 at update 6, the partial round synced" in (
        caplog.text
    )
    for (a, b), mean in zip(spy.weights, begin.weights):
        tolerance = 0 if outer is None else 1e-6
        np.testing.assert_allclose(mean, (a + b) / np.float32(2), atol=tolerance, rtol=0)
    assert spy.slots and not np.array_equal(*spy.slots[0])
    for copies, slot in zip(spy.slots, begin.slots):
        np.testing.assert_array_equal(slot, copies[0])
    assert history["syncs"] == [4.0]  # update 4, the resume's, 8 and 12
