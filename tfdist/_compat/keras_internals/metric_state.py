"""Metric state as local tensors, for exact parameter-server logs.

Under ParameterServerStrategy, metric variables live on the ps tasks and many
steps update them at once: a log read while they run can be torn (a total that
includes a step whose count is not in yet: accuracy 1.28). The PS runner
therefore traces its scheduled function with each metric variable's TF variable
swapped for a local tensor that starts at zero: each execution computes the
sums of its own steps, which the coordinator adds up in order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import keras
import numpy as np
import tensorflow as tf


class _StateBox:
    """Stands in for a metric's TF variable while tracing: its value is a plain tensor."""

    def __init__(self, value: Any, dtype: Any) -> None:
        self.dtype = tf.as_dtype(dtype)
        self.current = tf.convert_to_tensor(value, dtype=self.dtype)

    @property
    def shape(self) -> tf.TensorShape:
        return self.current.shape

    def assign(self, value, **_):
        self.current = tf.convert_to_tensor(value, dtype=self.dtype)
        return self.current

    def assign_add(self, value, **_):
        return self.assign(self.current + tf.cast(value, self.dtype))

    def assign_sub(self, value, **_):
        return self.assign(self.current - tf.cast(value, self.dtype))

    def read_value(self):
        return self.current

    def value(self):
        return self.current

    def numpy(self):
        return self.current.numpy()

    def __getitem__(self, index):
        # AUC(curve="PR") slices its variables in result().
        return self.current[index]

    def __array__(self, dtype=None, copy=None):
        # A metric whose result() is its variable itself is read through NumPy.
        return np.asarray(self.current.numpy(), dtype=dtype)


tf.register_tensor_conversion_function(
    _StateBox,
    lambda box, dtype=None, name=None, as_ref=False: tf.convert_to_tensor(box.current, dtype=dtype),
)


def metric_variables(model: keras.Model) -> list[Any]:
    """The model's metric state variables (loss tracker and compiled metrics)."""
    return list(model.metrics_variables)


def additive(variables: list[Any]) -> bool:
    """Whether every variable is summed across replicas, so per-execution sums can be added up."""
    return all(getattr(v, "aggregation", None) == "sum" for v in variables)


@contextlib.contextmanager
def metric_state_as_tensors(
    variables: list[Any], values: list[Any] | None = None
) -> Iterator[list[_StateBox]]:
    """Within this block, ``variables`` (Keras metric variables) read and write local tensors.

    Args:
        variables: Keras variables, e.g. `metric_variables`.
        values: Their starting values; default zeros.

    Yields:
        One box per variable; ``box.current`` is the variable's current tensor.
    """
    # A Keras variable reads and writes its backend variable through the private `_value`:
    # swapping it is the one way to redirect a metric's updates without rebuilding the metric.
    saved = [v._value for v in variables]
    if values is None:
        values = [tf.zeros(v.shape, v.dtype) for v in variables]
    boxes = [_StateBox(value, v.dtype) for v, value in zip(variables, values)]
    for v, box in zip(variables, boxes):
        v._value = box
    try:
        yield boxes
    finally:
        for v, value in zip(variables, saved):
            v._value = value
