"""Finished input iterators are let go of on a background thread (``tfdist.data.release``).

Deleting a tf.data iterator waits for its autotuning thread, seconds after a long epoch; the
Trainer hands each finished epoch's iterator (and a fit's one repeated stream) to the thread
instead, so the next epoch does not wait. What it saves is measured in docs/benchmarks.md.
"""

import threading
import time
import weakref

import keras
import numpy as np

import tfdist
from tfdist.data import release as release_module
from tfdist.training import epochs


class SlowToDrop:
    """Takes ``seconds`` to delete, and notes which thread deleted it."""

    dropped_on: list[str] = []

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __del__(self) -> None:
        time.sleep(self.seconds)
        SlowToDrop.dropped_on.append(threading.current_thread().name)


def test_release_returns_at_once_and_drain_waits_for_the_drop():
    releaser = release_module.Releaser()
    SlowToDrop.dropped_on = []
    started = time.perf_counter()
    releaser.release(SlowToDrop(0.3))
    releaser.release(SlowToDrop(0.0))
    assert time.perf_counter() - started < 0.2
    assert not releaser.drain(timeout=0.05)  # still dropping the first
    assert releaser.drain(timeout=5.0)
    assert SlowToDrop.dropped_on == ["tfdist-release", "tfdist-release"]
    assert releaser.drain(timeout=0.0)  # nothing left: at once


def test_the_thread_waits_for_the_caller_to_let_go():
    releaser = release_module.Releaser()
    SlowToDrop.dropped_on = []
    kept = SlowToDrop(0.0)
    releaser.release(kept)
    time.sleep(0.05)
    assert SlowToDrop.dropped_on == []  # the caller still holds it
    del kept
    assert releaser.drain(timeout=5.0)
    assert SlowToDrop.dropped_on == ["tfdist-release"]


def test_each_epochs_iterator_is_handed_over_and_dropped(monkeypatch):
    handed: list[weakref.ref] = []

    def note(obj):
        handed.append(weakref.ref(obj))
        release_module.release(obj)

    monkeypatch.setattr(epochs, "release", note)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 4)).astype("float32"), rng.integers(0, 2, 64)
    trainer = tfdist.Trainer(
        lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]),
        strategy=tfdist.make_strategy("one_device"),
        optimizer="sgd",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    history = trainer.fit(x, y, batch_size=16, epochs=3, verbose=0)
    assert len(history.history["loss"]) == 3
    assert len(handed) == 3  # one iterator per epoch
    # With steps_per_epoch the epochs share one stream: handed over once, at the fit's end.
    trainer.fit(x, y, batch_size=16, epochs=2, steps_per_epoch=2, verbose=0)
    assert len(handed) == 4
    assert release_module.drain(timeout=30.0)
    assert all(ref() is None for ref in handed)
