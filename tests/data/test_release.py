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

import keras
import numpy as np

import tfdist
from tfdist.data import release as release_module
from tfdist.training.fit import train_loop as epochs


class SlowToDrop:
    """Takes ``seconds`` to delete; notes which thread deleted it, and when it began and ended."""

    dropped_on: list[str] = []
    spans: list[tuple[float, float]] = []

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __del__(self) -> None:
        began = time.perf_counter()
        time.sleep(self.seconds)
        SlowToDrop.spans.append((began, time.perf_counter()))
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


def test_objects_handed_over_together_are_dropped_side_by_side():
    releaser = release_module.Releaser()
    SlowToDrop.spans = []
    for _ in range(3):
        releaser.release(SlowToDrop(0.3))
    assert releaser.drain(timeout=10.0)
    assert len(SlowToDrop.spans) == 3
    # Every deletion began before any ended: none waited for another.
    assert max(b for b, _ in SlowToDrop.spans) < min(e for _, e in SlowToDrop.spans)


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
