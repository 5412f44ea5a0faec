"""The PS runner's watch over its workers: a stuck worker is treated as lost; update rates.

A real in-process cluster (2 workers, 1 ps, the shape the other PS tests share).
"""

import contextlib
import itertools
import logging
import threading
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.strategies.ps_common import ps_strategy
from tfdist.strategies.ps.failures import WorkerStuckError
from tfdist.strategies.ps.watchdog import DEFAULT_TIMEOUTS

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
FLOOR = 5.0  # seconds; healthy calls here take ~50 ms, so only a hang lasts this long
STEPS = 50  # per epoch


def _arrays():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 6)).astype("float32")
    return x, (x[:, 0] > 0).astype("int32")


def _model():
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)]
    )


class _Hang:
    """A ``py_function`` for the input pipelines: the ``at``-th element ever read hangs.

    Every worker's pipeline runs in this process here, so "one worker" is whichever
    reads that element (``InputContext.input_pipeline_id`` is 0 on every PS worker).
    """

    def __init__(self, *at):
        self.at, self._reads = at, itertools.count(1)  # next() is atomic: pipelines run at once
        self.release, self.started = threading.Event(), None

    def __call__(self, x):
        if next(self._reads) in self.at:
            self.started = time.monotonic()
            self.release.wait(300)
        return x

    def dataset_fn(self, ctx):
        x, y = _arrays()
        batches = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16, drop_remainder=True)
        return batches.map(self._read)

    def _read(self, x, y):
        return tf.ensure_shape(tf.py_function(self, [x], tf.float32), x.shape), y


def _trainer(strategy, **kwargs):
    return tfdist.Trainer(_model, strategy=strategy, optimizer="sgd", loss=LOSS, **kwargs)


class _Warnings(logging.Handler):
    """Records the watchdog's warnings, when they came, and the counts at that moment."""

    def __init__(self, runner):
        super().__init__(logging.WARNING)
        self.runner, self.seen = runner, []

    def emit(self, record):
        self.seen.append(
            (record.getMessage(), time.monotonic(), self.runner.worker_update_counts())
        )


@contextlib.contextmanager
def _watched(hang, **watchdog):
    """A Trainer on 2 workers (floor ``FLOOR``), its PS watchdog's warnings recorded.

    ``hang`` is released on the way out, so a failed check never leaves a pipeline blocked.
    """
    # The Trainer's watchdog numbers time each worker's calls.
    options = tfdist.WatchdogOptions(floor=FLOOR, first=120.0, **watchdog)
    trainer = _trainer(ps_strategy(num_workers=2, num_ps=1), watchdog=options)
    warnings = _Warnings(trainer.runner)
    logger = logging.getLogger("tfdist.strategies.ps.watchdog")
    logger.addHandler(warnings)
    try:
        yield trainer, warnings
    finally:
        hang.release.set()
        logger.removeHandler(warnings)


def _fit(trainer, hang):
    trainer.fit(hang.dataset_fn, epochs=2, steps_per_epoch=STEPS, global_batch_size=16, verbose=0)


def test_a_worker_stuck_in_its_input_pipeline_is_treated_as_lost():
    hang = _Hang(40)  # past both workers' first calls, mid first epoch
    with _watched(hang) as (trainer, warnings):
        _fit(trainer, hang)
        ended = time.monotonic()
    assert hang.started is not None
    [(message, warned, counts_then)] = warnings.seen
    stuck = message.split()[0]
    assert (
        stuck in ("worker:0", "worker:1") and " is stuck: its training call has run for " in message
    )
    # Detected after the floor, within the polling interval (0.5 s) and some scheduling slack.
    assert FLOOR <= warned - hang.started <= FLOOR + 3.0, warned - hang.started
    assert ended - warned <= 15.0  # the other worker finishes the run
    counts = trainer.runner.worker_update_counts()
    assert sum(counts.values()) == 2 * STEPS  # the stuck call ran again elsewhere, once
    assert counts[stuck] == counts_then[stuck]  # the named worker got no more calls
    # A cancelled call may have applied part of its step on the ps (at least once, as TF's
    # own re-runs of a failed worker's calls).
    assert 2 * STEPS <= int(trainer.model.optimizer.iterations.numpy()) <= 2 * STEPS + 1


def test_update_counts_and_rates_of_a_balanced_run(caplog):
    trainer = _trainer(ps_strategy(num_workers=2, num_ps=1))
    x, y = _arrays()
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)
    trainer.fit(data, epochs=2, steps_per_epoch=STEPS, global_batch_size=16, verbose=0)
    counts = trainer.runner.worker_update_counts()
    assert set(counts) == {"worker:0", "worker:1"}
    assert sum(counts.values()) == 2 * STEPS  # steps_per_execution=1: one call per step
    assert min(counts.values()) >= 0.2 * 2 * STEPS, counts  # both workers took a share
    with caplog.at_level(logging.INFO, "tfdist.strategies.ps.watchdog"):
        rates = trainer.runner.worker_update_rates(log=True)
    assert set(rates) == set(counts) and all(rate > 0 for rate in rates.values()), rates
    assert "worker:0" in caplog.text and "worker:1" in caplog.text


def test_timeouts_are_learned_and_clamped():
    timeouts = DEFAULT_TIMEOUTS  # a WatchdogOptions: the loop's rule, a 120 s floor
    assert timeouts.timeout(None) == 1800.0  # nothing finished yet
    assert timeouts.timeout(0.05) == 120.0  # 10 x 0.05 s, raised to the floor
    assert timeouts.timeout(30.0) == 300.0
    assert timeouts.timeout(600.0) == 1800.0  # lowered to the ceiling


def test_every_worker_stuck_at_once_ends_the_fit_with_a_clear_error():
    # Both workers' pipelines hang (their calls return, their outputs never come): nothing is
    # left to run the calls, so the fit fails; a launched job would exit with STUCK_EXIT_CODE.
    hang = _Hang(40, 41)
    with _watched(hang, exit=False) as (trainer, warnings):
        with pytest.raises(WorkerStuckError, match=r"worker:\d is stuck: its training call") as err:
            _fit(trainer, hang)
        ended = time.monotonic()
    assert "Restart the job" in str(err.value)
    assert any("stopping the fit" in message for message, _, _ in warnings.seen), warnings.seen
    # Bound: the floor after the first hang, plus polling (1 s) and scheduling slack: 8 s of it,
    # since a CI run on 2 busy cores took 6.3 s past the floor to cancel the closures.
    assert FLOOR <= ended - hang.started <= FLOOR + 8.0, ended - hang.started
