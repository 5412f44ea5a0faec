"""A ``PyDataset`` read by processes (``use_multiprocessing=True``) leaves none behind: Keras's
pool of forked readers ends with the pass that started it, whether the pass ran to its end,
stopped early, or its ``tf.data`` iterator was let go of mid-pass (as ``steps_per_epoch`` does)."""

import gc
import multiprocessing
import os
import time

import keras
import numpy as np
import pytest

from tfdist._compat.keras_internals.py_dataset import enqueued_batches
from tfdist.data import release
from tfdist.data.python_inputs import python_dataset

N = 12


class Batches(keras.utils.PyDataset):
    def __init__(self):
        super().__init__(workers=2, use_multiprocessing=True, max_queue_size=3)

    def __len__(self):
        return N

    def __getitem__(self, index):
        time.sleep(0.05)  # readers still busy when the pass stops
        return np.full((4, 2), index, "float32"), np.zeros((4, 1), "float32")


def gone(pid):
    """Whether ``pid`` no longer exists (reaped, not a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def readers():
    """The pids of the readers forked while the test ran; none may be left when it ends."""
    assert multiprocessing.active_children() == []
    seen = set()
    yield seen
    assert multiprocessing.active_children() == []
    assert seen and all(gone(pid) for pid in seen)


def note(seen):
    seen.update(p.pid for p in multiprocessing.active_children())


@pytest.mark.parametrize("read", [N, 5, 1])
def test_a_pass_stops_its_reader_processes(readers, read):
    """A pass read whole, one stopped after ``read`` batches, and one abandoned (closed)."""
    batches = enqueued_batches(Batches(), N if read == N else 5)
    got = []
    for batch in batches:
        note(readers)
        got.append(int(batch[0][0, 0]))
        if len(got) == read:
            break
    batches.close()
    assert got == list(range(read))


def test_a_dataset_let_go_of_mid_pass_stops_its_reader_processes(readers):
    """fit's path: a pass's ``tf.data`` iterator read for a few steps, then deleted (on the
    release thread, as fit lets go of an epoch's iterator)."""
    dataset, *_ = python_dataset(Batches(), training=True, shuffle=False, seed=0, argument="x")
    iterator = iter(dataset)
    for _ in range(3):
        next(iterator)
    note(readers)
    release.release(iterator)
    del iterator
    assert release.drain(60)
    gc.collect()
