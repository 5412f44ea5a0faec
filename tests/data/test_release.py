"""Finished input iterators are let go of on a background thread (``tfdist.data.release``).

Deleting a tf.data iterator waits for its autotuning thread, seconds after a long epoch; the
Trainer hands each finished epoch's iterator (and a fit's one repeated stream) to the thread
instead, so the next epoch does not wait. What it saves is measured in docs/benchmarks.md.
"""

import subprocess
import sys
import threading
import time
import weakref
from typing import Any

import keras
import numpy as np

import tfdist
from tfdist.data import release as release_module
from tfdist.training.fit import train_loop as epochs


class SlowToDrop:
    """Takes ``seconds`` to delete, or waits for ``until`` (an event or a barrier, 10 s at
    most); notes which thread deleted it, and whether ``until`` came in time."""

    dropped_on: list[str] = []
    met: list[bool] = []

    def __init__(self, seconds: float = 0.0, until: Any = None) -> None:
        self.seconds, self.until = seconds, until

    def __del__(self) -> None:
        if isinstance(self.until, threading.Barrier):
            try:
                self.until.wait()
                SlowToDrop.met.append(True)
            except threading.BrokenBarrierError:
                SlowToDrop.met.append(False)
        elif self.until is not None:
            SlowToDrop.met.append(self.until.wait(10.0))
        else:
            time.sleep(self.seconds)
        SlowToDrop.dropped_on.append(threading.current_thread().name)


# Events, not sleeps: a busy machine may take any time to run a thread, so the tests hold a
# deletion until they let it go, and never race a clock.


def test_release_returns_at_once_and_drain_waits_for_the_drop():
    releaser = release_module.Releaser()
    SlowToDrop.dropped_on, SlowToDrop.met = [], []
    go = threading.Event()
    releaser.release(SlowToDrop(until=go))
    releaser.release(SlowToDrop(0.0))
    # Returned while the first deletion is held: release did not wait for it (had it, the
    # deletion would have run here, on the main thread, after 10 s).
    assert "MainThread" not in SlowToDrop.dropped_on and not SlowToDrop.met
    assert not releaser.drain(timeout=0.05)  # still dropping the first
    go.set()
    assert releaser.drain(timeout=5.0)
    assert SlowToDrop.dropped_on == ["tfdist-release", "tfdist-release"]
    assert SlowToDrop.met == [True]
    assert releaser.drain(timeout=0.0)  # nothing left: at once


def test_objects_handed_over_together_are_dropped_side_by_side():
    releaser = release_module.Releaser()
    SlowToDrop.met = []
    # Each deletion waits until all three are deleting: one after another, the first would
    # wait its 10 s alone and find the barrier broken.
    together = threading.Barrier(3, timeout=10.0)
    for _ in range(3):
        releaser.release(SlowToDrop(until=together))
    assert releaser.drain(timeout=30.0)
    assert SlowToDrop.met == [True, True, True]


def test_the_exit_waits_for_a_deletion_in_progress(tmp_path):
    """A daemon thread must not come back from a deletion while the interpreter finalises
    (inside TensorFlow that aborts the process), so the exit waits for it."""
    done = tmp_path / "dropped"
    code = f"""
import importlib.util, time
spec = importlib.util.spec_from_file_location("release", {release_module.__file__!r})
release = importlib.util.module_from_spec(spec)
spec.loader.exec_module(release)

class Slow:
    def __del__(self):
        time.sleep(0.5)
        open({str(done)!r}, "w").close()

release.release(Slow())
time.sleep(0.1)  # the thread has it
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert done.exists()


def test_the_thread_waits_for_the_caller_to_let_go(monkeypatch):
    # The handover's bound well past any pause of this thread on a busy machine: past it, the
    # thread lets go anyway and the deletion would run here, at ``del kept``.
    monkeypatch.setattr(release_module, "HANDOVER_SECONDS", 60.0)
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
