"""Where each update's time goes on this worker: input, compute, the wait for the exchange.

Timestamps inside the compiled train loop, so that a slow worker can be told
from the ones that wait for it (see `tfdist.training.health.stragglers`):

* ``input``: from the start of an update to its batches being ready;
* ``compute``: from there to the local gradients being ready (the
  `mark` ``"compute"`` that the exchange sets just before its all-reduce);
* ``exchange``: from there to the summed gradients (the ``"exchange"`` mark).
  A worker that others wait for spends little here; the others spend the
  difference;
* ``total``: the wall time of the calls, measured by the runner around them.

A runner records the marks of one replica call with `recording` and
returns them as replica outputs; the loop sums them per call into a vector
(`FIELDS` but the total) that the runner hands to `StepClock.add`
with the call's wall time. Without the marks (a model's own ``train_step``)
``compute`` and ``exchange`` are NaN: only ``input`` and ``total`` are known.
Micro-batches accumulated in a symbolic loop are not timed at all.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

#: The clock's vector: updates, then seconds of input, compute, exchange and total.
FIELDS = ("updates", "input", "compute", "exchange", "total")
_MARKS = ("compute", "exchange")
_local = threading.local()


def timestamp_after(tensors: Any) -> tf.Tensor:
    """``tf.timestamp()`` once every tensor in ``tensors`` (a nest) has been computed."""
    flat = [t for t in tf.nest.flatten(tensors, expand_composites=True) if tf.is_tensor(t)]
    with tf.control_dependencies(flat):
        return tf.timestamp()


def mark(name: str, tensors: Any) -> None:
    """In replica context while `recording`: notes when ``tensors`` are ready as ``name``.

    Outside `recording` (an evaluation, a runner without a clock) it does nothing.
    """
    marks = getattr(_local, "marks", None)
    if marks is not None and name in _MARKS:
        marks[name] = timestamp_after(tensors)


@contextlib.contextmanager
def recording() -> Iterator[dict[str, tf.Tensor]]:
    """Collects this thread's `mark` calls (one replica's trace) into the yielded dict."""
    previous = getattr(_local, "marks", None)
    _local.marks = {}
    try:
        yield _local.marks
    finally:
        _local.marks = previous


def replica_marks(marks: dict[str, tf.Tensor]) -> tf.Tensor:
    """The marks as one float64 vector, NaN for a mark that was not set."""
    nan = tf.constant(math.nan, tf.float64)
    return tf.stack([marks.get(name, nan) for name in _MARKS])


def call_clock(
    started: tf.Tensor, inputs_ready: tf.Tensor, local_marks: Sequence[tf.Tensor]
) -> tf.Tensor:
    """One update's vector: 1, then seconds of input, compute and exchange.

    ``local_marks`` holds one `replica_marks` vector per local replica;
    the sections are their mean over this worker's replicas. The wall time of
    the whole call is added by the runner in Python (see `StepClock.add`).
    """
    marks = tf.reduce_mean(tf.stack(list(local_marks)), axis=0)
    one = tf.constant(1.0, tf.float64)
    return tf.stack([one, inputs_ready - started, marks[0] - inputs_ready, marks[1] - marks[0]])


class StepClock:
    """Sums of the per-update sections on this worker, taken and reset by a reader.

    Attributes:
        enabled: Whether the runner compiles the timestamps into its train loop.
    """

    def __init__(self) -> None:
        self.enabled = False
        self._lock = threading.Lock()
        self._sums = np.zeros(len(FIELDS))

    def add(self, vector: Any) -> None:
        """Adds one call's `FIELDS` (its `call_clock` sums, then its wall time)."""
        values = np.asarray(vector, dtype=np.float64)
        with self._lock:
            self._sums += values

    def take(self) -> dict[str, float]:
        """The sums since the last ``take`` (NaN sections when unknown), then starts again."""
        with self._lock:
            sums, self._sums = self._sums, np.zeros(len(FIELDS))
        return dict(zip(FIELDS, (float(v) for v in sums)))
