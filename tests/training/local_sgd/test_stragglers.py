"""Local SGD adapting to stragglers (`tfdist.training.local_sgd.stragglers`), in one process:
the schedule's arithmetic, equal rates exactly plain local SGD, a forced schedule's skips.

The 2-worker check (a slowed worker takes fewer inner steps, both bitwise equal after each
sync) shares ``tests/strategies/test_multi_worker.py``'s launch.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.jobs.common import builder, data
from tests.training.local_sgd.common import LOSS, W0, dataset
from tfdist.training.local_sgd import stragglers


@pytest.mark.parametrize("steps", [1, 2, 3, 4, 5])
def test_a_round_takes_its_steps_spread_evenly(steps):
    taken = [bool(stragglers.takes_step(j, steps, 5)) for j in range(5)]
    assert sum(taken) == steps
    assert taken[-1]  # the round's last update is taken: the weights are fresh at the sync
    counts = [int(stragglers.taken(j, steps, 5)) for j in range(6)]
    assert counts == [sum(taken[:j]) for j in range(6)]


def test_the_steps_follow_the_rates_and_equal_rates_take_every_step():
    seconds = tf.constant([0.01, 0.04, 0.0105, 0.0, 1.0])
    steps = stragglers.inner_steps(seconds, 8).numpy().tolist()
    # fastest 8; 4x slower 2; within the tolerance 8; unknown 8; 100x slower still 1
    assert steps == [8, 2, 8, 8, 1]
    assert stragglers.inner_steps(tf.fill([3], 0.02), 16).numpy().tolist() == [16] * 3
    w = stragglers.weights(tf.constant(8), tf.constant([8, 2, 8]), 8, tf.float32).numpy()
    np.testing.assert_array_equal(w, [1.0, 0.25, 1.0])
    partial = stragglers.weights(tf.constant(3), tf.constant([8, 2]), 8, tf.float32).numpy()
    np.testing.assert_array_equal(partial, [1.0, 0.0])  # 3 updates in: the slow one took none
    previous, measured = tf.constant([0.0, 0.2, 0.2, -1.0]), tf.constant([0.1, 0.4, 0.0, 0.3])
    smoothed = stragglers.smoothed(previous, measured)
    np.testing.assert_allclose(smoothed.numpy(), [0.1, 0.3, 0.2, 0.0])  # the first: dropped


def _fit(strategy, local_sgd, optimizer=None, callbacks=None):
    trainer = tfdist.Trainer(
        builder(W0),
        strategy=strategy,
        optimizer=optimizer or keras.optimizers.SGD(0.1),
        loss=LOSS,
        local_sgd=local_sgd,
    )
    history = trainer.fit(dataset(), epochs=2, verbose=0, callbacks=callbacks)
    return trainer, history.history


def test_with_equal_rates_it_is_plain_local_sgd_bitwise():
    """Mirrored x2 (one worker: equal rates), DiLoCo (Adam inside, momentum SGD outside; its
    weighted outer gradient is plain averaging's weighted mean, less the anchor),
    sync_every=5 (12 updates: a partial round at the fit's end): the same bits as without
    adapting."""
    mirrored = tfdist.make_strategy("mirrored", num_devices=2)
    weights = []
    for adapt in (False, True):
        outer = keras.optimizers.SGD(0.7, momentum=0.9)
        options = tfdist.LocalSGDOptions(5, outer, adapt_to_stragglers=adapt)
        trainer, history = _fit(mirrored, options, keras.optimizers.Adam(0.01))
        weights.append(trainer.model.get_weights())
    assert history["local_steps"] == [6.0, 12.0] and history["syncs"] == [1.0, 2.0]
    for a, b in zip(*weights):
        np.testing.assert_array_equal(a, b)


class _Force(keras.callbacks.Callback):
    """The first round's steps forced to ``steps`` (as if this worker were measured slow)."""

    def __init__(self, trainer, steps):
        super().__init__()
        self.trainer, self.steps = trainer, steps

    def on_train_begin(self, logs=None):
        self.trainer._functions.updates.local.steps.assign([self.steps])


def test_a_slow_round_skips_its_batches_and_moves_only_the_iterations():
    """One device, sync_every=4, momentum SGD, the first round forced to 2 steps: it trains on
    the 2nd and 4th batches only (the 1st and 3rd read and dropped; the momentum's move on
    their zero gradients undone), the sync weighs its one replica fully; then, measured alone
    (the fastest), every step: as Keras on those 10 batches."""
    one = tfdist.make_strategy("one_device")
    options = tfdist.LocalSGDOptions(4, adapt_to_stragglers=True)
    trainer = tfdist.Trainer(
        builder(W0), strategy=one, optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
        loss=LOSS, local_sgd=options,
    )  # fmt: skip
    history = trainer.fit(dataset(), epochs=2, verbose=0, callbacks=[_Force(trainer, 2)]).history
    assert history["local_steps"] == [4.0, 10.0]
    assert int(trainer.model.optimizer.iterations.numpy()) == 12
    model = builder(W0)()
    model.compile(keras.optimizers.SGD(0.1, momentum=0.9), LOSS)
    batches = list(dataset()) * 2
    for i in [1, 3, *range(4, 12)]:
        model.train_on_batch(*batches[i])
    for a, b in zip(model.get_weights(), trainer.model.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)


def test_data_of_unknown_length_is_refused_when_adapting():
    one = tfdist.make_strategy("one_device")
    options = tfdist.LocalSGDOptions(4, adapt_to_stragglers=True)
    trainer = tfdist.Trainer(
        builder(W0), strategy=one, optimizer="sgd", loss=LOSS, local_sgd=options
    )
    x, y = data()
    unknown = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda a, b: True).batch(16)
    with pytest.raises(ValueError, match="adapt_to_stragglers=False here"):
        trainer.fit(unknown, epochs=1, verbose=0)


def test_options_check_adapt_to_stragglers():
    with pytest.raises(ValueError, match="adapt_to_stragglers"):
        tfdist.LocalSGDOptions(4, adapt_to_stragglers="yes")


def test_the_straggler_report_on_several_workers_is_refused_when_adapting():
    """On several workers the straggler report's timed calls run each update inside a replica
    call, where it cannot be skipped: one error naming both, before anything is built."""
    from types import SimpleNamespace

    from tfdist.training.health.stragglers import DEFAULT_STRAGGLERS
    from tfdist.training.local_sgd.options import check_local_sgd

    runner = SimpleNamespace(local_sgd_refusal=None, loop_tasks=["worker:0", "worker:1"])
    model = builder(W0)()
    options = tfdist.LocalSGDOptions(4, adapt_to_stragglers=True)
    for report, refused in ((DEFAULT_STRAGGLERS, True), (None, False)):
        trainer_options = SimpleNamespace(
            exchange=SimpleNamespace(sharding=None), pipeline=None, balance=None, stragglers=report
        )
        if refused:
            with pytest.raises(ValueError, match="with the straggler report on"):
                check_local_sgd(options, runner, trainer_options, model)
        else:
            check_local_sgd(options, runner, trainer_options, model)


def _lm_fit(options):
    """The causal transformer LM (tests/keras_parity/rows_transformers.py: an Embedding, causal
    MultiHeadAttention, LayerNormalization, Dense over 3-D input) on mirrored x2 with Adam, its
    padding ignored (a masked loss): 4 updates, 2 epochs."""
    from tests.keras_parity.rows_transformers import lm_model, text

    mirrored = tfdist.make_strategy("mirrored", num_devices=2)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0)
    trainer = tfdist.Trainer(
        lm_model, strategy=mirrored, optimizer=keras.optimizers.Adam(0.01), loss=loss,
        local_sgd=options, steps_per_execution=1,
    )  # fmt: skip
    ids = text(16)
    fit = trainer.fit(ids[:, :-1], ids[:, 1:], batch_size=8, epochs=2, verbose=0)
    return trainer.model.get_weights(), fit.history


def test_a_transformer_with_sparse_gradients_adapts_as_plain_local_sgd_bitwise():
    """An Embedding's rows (``tf.IndexedSlices``) stay rows when adapting (a skipped update's
    are none), so Adam sees the duplicate rows plain local SGD hands it: with equal rates
    (mirrored x2, sync_every=3, 4 updates: a partial round at the fit's end) the same bits as
    without adapting, with a masked loss (its terms' rows stacked beside the loss's own).
    Busy AMD EPYC (2 cores): ~15 CPU-s, 2 fits."""
    plain, _ = _lm_fit(tfdist.LocalSGDOptions(3))
    adapted, history = _lm_fit(tfdist.LocalSGDOptions(3, adapt_to_stragglers=True))
    assert history["local_steps"] == [2.0, 4.0] and history["syncs"] == [0.0, 1.0]
    for a, b in zip(plain, adapted):
        np.testing.assert_array_equal(a, b)
