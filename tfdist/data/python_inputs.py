"""Python inputs Keras's ``fit`` takes: a generator of batches and a ``keras.utils.PyDataset``.

Both become a ``tf.data.Dataset`` of **global** batches read by ``from_generator`` in this
process, as Keras's TF backend reads them (``GeneratorDataAdapter``, ``PyDatasetAdapter``):

* a generator: its first two batches are peeked for the element spec (Keras's
  ``NUM_BATCHES_FOR_TENSOR_SPEC``) and chained back in front of the rest, as Keras does, so no
  batch is lost; each new pass (a new iterator) chains those two again with what the
  generator still holds. Its length is unknown: an epoch runs until it is exhausted, unless
  ``steps_per_epoch`` is given (then one stream runs across the epochs, as in Keras). An
  evaluation of ``steps`` batches (``validation_steps``) reads one batch more, lost with its
  pass, as Keras's prefetch buffer does, so the next evaluation validates the batches Keras's
  does;
* a ``PyDataset``: one pass per iterator over ``range(len(ds))`` (reordered with a seeded
  permutation per pass when training with ``shuffle=True``; Keras draws its order from
  Python's ``random``), read by Keras's own enqueuer when ``workers > 1`` or
  ``use_multiprocessing`` (``tfdist._compat.keras_internals.py_dataset``). ``on_epoch_begin`` and
  ``on_epoch_end`` are called around each pass, and ``on_epoch_end`` once more when the
  input is made (Keras's ``EpochIterator.reset`` at the start of ``fit``) or, for
  evaluation, before each pass.

The batch dimension of the spec is always ``None`` (Keras keeps it when the two peeked batches
agree, and then fails on a partial last batch). On multi_worker each worker's process runs the
user's script, so each has its own generator or ``PyDataset`` giving the same global batches,
split across the workers like any dataset of global batches. The batches come from Python code
in this process, so they cannot be read by remote parameter-server workers
(``PSRunner.distribute`` refuses them for training).
"""

from __future__ import annotations

import itertools
import logging
import types
from collections.abc import Iterator
from typing import Any, Protocol

import keras
import numpy as np
import tensorflow as tf

from tfdist._compat.keras_internals.py_dataset import enqueued_batches, reads_in_parallel
from tfdist.config import invalid_argument

logger = logging.getLogger(__name__)
NUM_PEEKED = 2  # Keras's NUM_BATCHES_FOR_TENSOR_SPEC
_END = object()  # a generator's end, for next(iterator, _END)


def is_python_input(data: Any) -> bool:
    """Whether ``data`` is a Python generator or a ``keras.utils.PyDataset`` (Keras's tests)."""
    return isinstance(data, (types.GeneratorType, keras.utils.PyDataset))


def kind_of(data: Any) -> str:
    """How an error names the kind of a Python input."""
    return "a Python generator" if isinstance(data, types.GeneratorType) else "a PyDataset"


def python_dataset(
    data: Any,
    *,
    training: bool,
    shuffle: bool | str,
    seed: int,
    argument: str,
    steps: int | None = None,
) -> tuple[tf.data.Dataset, int, int | None, Any]:
    """``data`` as a dataset of global batches, its first batch's size, its batches per pass,
    and a ``PyDataset``'s epoch hooks (None for a generator): see `EpochHooks`.

    ``steps``: the batches each evaluation pass reads (``validation_steps``, ``evaluate``'s
    ``steps``); a generator's pass then ends after them (see `_Rechained`).

    Raises:
        ValueError: Naming ``argument``, for a generator that yields nothing or something
            other than ``(x,)``, ``(x, y)`` or ``(x, y, sample_weight)`` tuples, or a
            ``PyDataset`` of length 0 or whose items are not batches.
    """
    if isinstance(data, keras.utils.PyDataset):
        # Keras shuffles a PyDataset's batch order for any true shuffle ("batch" too).
        reader = _PassReader(
            data, shuffle=training and bool(shuffle), seed=seed, reset=not training
        )
        peeked = reader.peek(argument)
        if training:
            data.on_epoch_end()  # Keras's fit resets its epoch iterator once before epoch 1
        steps, hooks = reader.num_batches, reader
    else:
        peeked, rest = _peek(data, argument)
        reader = _Rechained(peeked, rest, per_pass=None if training else steps)
        steps, hooks = None, None
    spec = _spec(peeked, argument)
    ds = tf.data.Dataset.from_generator(reader, output_signature=spec)
    if isinstance(data, keras.utils.PyDataset):  # its length, or endless
        cardinality = tf.data.INFINITE_CARDINALITY if steps is None else steps
        ds = ds.apply(tf.data.experimental.assert_cardinality(cardinality))
    first = tf.nest.flatten(peeked[0])[0]
    return ds, int(np.shape(first)[0]), steps, hooks


def _peek(generator: Iterator[Any], argument: str) -> tuple[list[Any], Iterator[Any]]:
    """The generator's first batches (Keras's peek), checked to be tuples; and the generator."""
    peeked = [_as_tuples(b) for b in itertools.islice(generator, NUM_PEEKED)]
    if not peeked:
        raise invalid_argument(
            argument, "an empty generator", "a generator that yields at least one batch"
        )
    if not isinstance(peeked[0], tuple) or not 1 <= len(peeked[0]) <= 3:
        raise invalid_argument(
            argument,
            f"a generator yielding {type(peeked[0]).__name__}",
            "a generator of (x,), (x, y) or (x, y, sample_weight) tuples, as in Keras",
        )
    return peeked, generator


class _Rechained:
    """``from_generator``'s callable for a generator: the peeked batches, then the rest.

    Each call (a new iterator: a new epoch without ``steps_per_epoch``, or a new evaluation)
    chains the peeked batches again with what the generator has left, as Keras does.

    With ``per_pass`` (an evaluation of that many batches) a pass yields at most ``per_pass``
    batches and reads one more, which is lost with the pass: Keras reads the pass through
    ``prefetch(AUTOTUNE)``, whose buffer holds one batch ahead when the evaluation stops, and
    drops it with the iterator (``GeneratorDataAdapter``; each evaluation makes a new one). So
    the next evaluation goes on one batch further, as Keras's does. (Keras's buffer may grow to
    hold two when its consumer outpaces the generator; one is its usual depth.)
    """

    def __init__(self, peeked: list[Any], rest: Iterator[Any], per_pass: int | None) -> None:
        self.peeked, self.rest, self.per_pass = peeked, rest, per_pass
        self.exhausted = False

    def __call__(self) -> Iterator[Any]:
        if self.exhausted:
            logger.warning(
                "The generator ran out of batches: this pass reads again only the %d batches "
                "peeked for its element spec, as Keras does. Make it endless (`while True:`), "
                "or give steps_per_epoch (validation_steps) within what it yields.",
                len(self.peeked),
            )
        chain = itertools.chain(self.peeked, self.rest)
        if self.per_pass is None:
            for batch in chain:
                yield _as_tuples(batch)
            self.exhausted = True
            return
        # Read one batch ahead before yielding, so the batch after the pass's last is read
        # however far the pipeline that consumes the pass prefetches.
        ahead = next(chain, _END)
        for _ in range(self.per_pass):
            if ahead is _END:
                break
            batch, ahead = ahead, next(chain, _END)
            yield _as_tuples(batch)
        self.exhausted = ahead is _END


class EpochHooks(Protocol):
    """A ``PyDataset``'s ``on_epoch_begin``/``on_epoch_end`` when an epoch is not one pass.

    By default they run around each pass, which is each epoch when an epoch reads one pass.
    With ``steps_per_epoch`` (one stream across the epochs) the loop calls `per_epoch`
    once, then `epoch_begin` and `epoch_end` around each epoch, as Keras does.
    """

    def per_epoch(self) -> None: ...

    def epoch_begin(self) -> None: ...

    def epoch_end(self) -> None: ...


class _PassReader:
    """``from_generator``'s callable for a ``PyDataset``: one pass per call, hooks around it."""

    def __init__(self, py_dataset: Any, *, shuffle: bool, seed: int, reset: bool) -> None:
        self.py_dataset, self.shuffle, self.seed, self.reset = py_dataset, shuffle, seed, reset
        self.num_batches = py_dataset.num_batches  # None: endless
        self.passes = 0
        self.hooks_per_pass = True

    def per_epoch(self) -> None:
        self.hooks_per_pass = False

    def epoch_begin(self) -> None:
        self.py_dataset.on_epoch_begin()

    def epoch_end(self) -> None:
        self.py_dataset.on_epoch_end()

    def peek(self, argument: str) -> list[Any]:
        """The first batches (Keras reads them for the element spec before ``fit`` starts)."""
        n = NUM_PEEKED if self.num_batches is None else min(NUM_PEEKED, self.num_batches)
        if n == 0:
            raise invalid_argument(argument, "a PyDataset of length 0", "at least one batch")
        return [_standardized(self.py_dataset[i], argument) for i in range(n)]

    def __call__(self) -> Iterator[Any]:
        ds, n = self.py_dataset, self.num_batches
        hooks = self.hooks_per_pass
        if hooks and self.reset:
            ds.on_epoch_end()  # Keras's evaluate resets its epoch iterator first
        if hooks:
            ds.on_epoch_begin()
        view = ds
        if self.shuffle and n is not None:
            order = np.random.default_rng(self.seed + self.passes).permutation(n)
            view = _Reordered(ds, order)
        self.passes += 1
        if reads_in_parallel(ds):
            batches = enqueued_batches(view, n)
        else:
            batches = (view[i] for i in (range(n) if n is not None else itertools.count()))
        for batch in batches:
            yield _standardized(batch, "x")
        if hooks:
            ds.on_epoch_end()


class _Reordered(keras.utils.PyDataset):
    """A ``PyDataset``'s batches in ``order`` (the same workers and queue options)."""

    def __init__(self, base: Any, order: np.ndarray) -> None:
        super().__init__(
            workers=base.workers,
            use_multiprocessing=base.use_multiprocessing,
            max_queue_size=base.max_queue_size,
        )
        self.base, self.order = base, order

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, index: int) -> Any:
        return self.base[int(self.order[index])]


def _standardized(batch: Any, argument: str) -> Any:
    """A ``PyDataset`` item as Keras takes it: a dict, an array (``(x,)``) or a 1-3 tuple."""
    if isinstance(batch, dict):
        return (_as_tuples(batch),)
    if isinstance(batch, np.ndarray):
        return (batch,)
    batch = _as_tuples(batch)
    if not isinstance(batch, tuple) or not 1 <= len(batch) <= 3:
        raise invalid_argument(
            argument,
            f"a PyDataset whose __getitem__ returns {type(batch).__name__}",
            "batches as (x,), (x, y) or (x, y, sample_weight) tuples, or a dict, as in Keras",
        )
    return batch


def _as_tuples(structure: Any) -> Any:
    """Lists as tuples (one array per input: tf.data would stack a list), arrays as NumPy
    COPIES: ``from_generator`` may hand TF an array's own memory, which TF then treats as its
    to reuse in place, so a batch kept (the peeked ones) or a view of the user's arrays would
    be overwritten (seen: the peeked batches changed after one pass)."""
    if isinstance(structure, (list, tuple)):
        return tuple(_as_tuples(s) for s in structure)
    if isinstance(structure, dict):
        return {k: _as_tuples(v) for k, v in structure.items()}
    return structure if structure is None else np.array(structure)


def _spec(peeked: list[Any], argument: str) -> Any:
    """The element spec of the peeked batches: dimensions they disagree on, and the batch, None."""

    def leaf(*arrays: np.ndarray) -> tf.TensorSpec:
        ranks = {a.ndim for a in arrays}
        if len(ranks) != 1 or 0 in ranks:
            raise invalid_argument(
                argument,
                [a.shape for a in arrays],
                "batches of arrays of rank at least 1, the same rank in every batch",
            )
        dims = [
            d if len({a.shape[i] for a in arrays}) == 1 else None
            for i, d in enumerate(arrays[0].shape)
        ]
        return tf.TensorSpec([None, *dims[1:]], tf.as_dtype(arrays[0].dtype))

    try:
        return tf.nest.map_structure(leaf, *peeked)
    except (ValueError, TypeError) as e:
        if "Invalid value" in str(e):
            raise
        raise invalid_argument(
            argument, type(peeked[0]).__name__, "batches of the same structure", note=str(e)
        ) from e
