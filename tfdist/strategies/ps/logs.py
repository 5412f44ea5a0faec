"""Exact running logs of parameter-server training calls, computed only when read.

Metric variables on the ps tasks cannot be read consistently while other steps
update them (a total may already include a step whose count is not in yet), so
each scheduled training call sums its own steps' metric state in local tensors
(``tfdist._compat.keras_internals.metric_state``). When the fit's callbacks may read batch
logs, the call returns those sums; the coordinator adds them up in call order,
and a call's logs are Keras's metric results over the sums of the calls up to
it: exact running means, as under the sync strategies.

What each call costs is kept small, because most calls' logs are never read:

* a call returns **one** float64 vector, its logs then its metric sums
  (`Packing`). TF's coordinator copies every output of a call to the
  coordinator before that worker's thread takes its next call, one remote copy
  per tensor; one vector is one copy. float64 holds every float32 and every
  integer below 2**53 exactly. When no callback reads batch logs, a call
  returns nothing at all (``PSRunner.expect_batch_logs``);
* the coordinator adds the vectors in order (`RunningLogs`), one NumPy
  add per call, and hands out each call's logs as a `tfdist.logs.LazyLogs`
  that computes the metric results (Keras ops on the coordinator) only when a
  callback or the progress bar reads a value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tfdist.logs import LazyLogs, as_floats

#: ``metric_logs(state)``: Keras's metric results (name -> scalar) with the model's metric
#: variables holding ``state``, one array per variable.
MetricLogs = Callable[[list[np.ndarray]], Mapping[str, Any]]


class Packing:
    """How one training call's logs and metric sums travel: one float64 vector.

    The vector holds the call's logs (each a scalar, in ``names`` order) and
    then every metric variable's sum over the call's steps, flattened.

    Args:
        variables: The model's metric variables (Keras variables), in order.
    """

    def __init__(self, variables: Sequence[Any]) -> None:
        self.shapes = [tuple(int(d) for d in v.shape) for v in variables]
        self.dtypes = [np.dtype(str(v.dtype)) for v in variables]
        self.sizes = [int(np.prod(shape)) for shape in self.shapes]
        self.names: list[str] = []  # the logs' names, known once a function is traced

    def pack(self, logs: Mapping[str, Any], state: Sequence[tf.Tensor]) -> tf.Tensor:
        """The vector of ``logs`` and the metric ``state``; runs while tracing, on a worker."""
        self.names = list(logs)
        # A non-scalar log fails here, as as_floats would fail on it.
        parts = [tf.reshape(_as_float64(logs[name]), [1]) for name in self.names]
        parts += [tf.reshape(_as_float64(value), [-1]) for value in state]
        return tf.concat(parts, axis=0)

    def logs(self, vector: np.ndarray) -> dict[str, float]:
        """The call's own logs, by name."""
        return {name: float(vector[i]) for i, name in enumerate(self.names)}

    def sums(self, vector: np.ndarray) -> np.ndarray:
        """The metric sums part of ``vector`` (a view)."""
        return vector[len(self.names) :]

    def state(self, sums: np.ndarray) -> list[np.ndarray]:
        """``sums`` as one array per metric variable, in its shape and dtype."""
        ends = np.cumsum(self.sizes)
        return [
            part.reshape(shape).astype(dtype)
            for part, shape, dtype in zip(np.split(sums, ends[:-1]), self.shapes, self.dtypes)
        ]


def _as_float64(value: Any) -> tf.Tensor:
    return tf.cast(tf.convert_to_tensor(value), tf.float64)


class RunningLogs:
    """One epoch's logs: the vectors of its calls added up in call order.

    Args:
        packing: The layout of the vectors.
        metric_logs: Keras's metric results over a metric state.
    """

    def __init__(self, packing: Packing, metric_logs: MetricLogs) -> None:
        self.packing = packing
        self.metric_logs = metric_logs
        self.total = np.zeros(sum(packing.sizes), np.float64)
        self.names = sorted(
            {*packing.names, *metric_logs(packing.state(np.zeros_like(self.total)))}
        )

    def add(self, vector: np.ndarray) -> LazyLogs:
        """Adds one call's ``vector``; returns the running logs up to and including that call.

        The logs are computed when first read, from the sums as they stand now.
        """
        packing, metric_logs = self.packing, self.metric_logs
        self.total = self.total + packing.sums(vector)  # a new array: earlier logs keep theirs
        own, total = packing.logs(vector), self.total

        def compute() -> dict[str, float]:
            return as_floats({**own, **metric_logs(packing.state(total))})

        return LazyLogs(self.names, compute)
