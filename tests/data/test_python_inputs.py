"""Python inputs as Keras's TF backend reads them: a generator's peeked batches chained back (and
the batch Keras reads ahead of an evaluation's last, lost), a ``PyDataset``'s passes, hooks,
seeded shuffling and parallel readers (no training here)."""

import keras
import numpy as np

from tfdist.data.python_inputs import python_dataset

N, BATCH = 37, 8  # 5 batches, the last of 5


def ids(dataset):
    """The example ids of each batch, in order (the examples are their ids)."""
    return [list(batch[0][:, 0].astype(int)) for batch in dataset.as_numpy_iterator()]


class Recorded(keras.utils.PyDataset):
    def __init__(self, calls, **kwargs):
        super().__init__(**kwargs)
        self.calls = calls

    def __len__(self):
        return -(-N // BATCH)

    def __getitem__(self, index):
        rows = np.arange(index * BATCH, min((index + 1) * BATCH, N), dtype="float32")
        return rows[:, None], rows

    def on_epoch_begin(self):
        self.calls.append("begin")

    def on_epoch_end(self):
        self.calls.append("end")


def test_python_inputs_read_as_keras_reads_them():
    whole = [list(range(i, min(i + BATCH, N))) for i in range(0, N, BATCH)]

    def generator():
        for batch in whole:
            rows = np.array(batch, "float32")
            yield rows[:, None], rows

    # A generator: nothing lost to the peek; a second pass chains the 2 peeked batches again.
    ds, first, steps, hooks = python_dataset(
        generator(), training=True, shuffle=True, seed=0, argument="x"
    )
    assert (first, steps, hooks) == (BATCH, None, None)
    assert ds.element_spec[0].shape.as_list() == [None, 1]  # a partial last batch fits
    assert ids(ds) == whole
    assert ids(ds) == whole[:2]

    # Evaluated 3 batches at a time (validation_steps=3): each pass reads one batch more, lost
    # with it, as Keras's prefetch buffer does; the third pass finds the generator exhausted.
    ds, *_ = python_dataset(
        generator(), training=False, shuffle=False, seed=0, argument="x", steps=3
    )
    assert ids(ds) == whole[:3]
    assert ids(ds) == [*whole[:2], whole[4]]
    assert ids(ds) == whole[:2]

    # A PyDataset: on_epoch_end once when made (Keras's reset), then begin/end around each pass.
    calls = []
    ds, first, steps, _ = python_dataset(
        Recorded(calls), training=False, shuffle=True, seed=0, argument="x"
    )
    assert (first, steps, int(ds.cardinality())) == (BATCH, 5, 5)
    assert ids(ds) == whole and calls == ["end", "begin", "end"]  # evaluation: never shuffled

    # Shuffled for training: each pass a new seeded permutation of the batches, the same in
    # every process (every worker); read by 2 threads or 2 processes, the same order.
    orders = []
    for options in ({}, {"workers": 2}, {"workers": 2, "use_multiprocessing": True}):
        calls = []
        ds, *_ = python_dataset(
            Recorded(calls, **options), training=True, shuffle=True, seed=3, argument="x"
        )
        passes = [ids(ds), ids(ds)]
        assert calls == ["end"] + ["begin", "end"] * 2
        assert all(sorted(p) == whole for p in passes) and passes[0] != passes[1]
        orders.append(passes)
    assert orders[0] == orders[1] == orders[2]
