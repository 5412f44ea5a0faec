"""One conversion of a logs dict (tensors, NumPy values) to Python floats.

A leaf module (NumPy only, no TensorFlow import): the runners in
``tfdist.strategies``, the training loop and the launch engines all import it
without an import circle, and ``tfdist launch`` stays TensorFlow-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


def as_floats(logs: Mapping[str, Any]) -> dict[str, float]:
    """Returns ``logs`` with every value as a Python ``float``.

    Args:
        logs: Metric name to a scalar: an eager ``tf.Tensor``, a NumPy value,
            or a Python number.

    Returns:
        A new dict, in the same key order.
    """
    # np.asarray reads an eager tensor without a device copy of its own and accepts plain
    # numbers and NumPy scalars alike; float() then fails loudly on a non-scalar.
    return {name: float(np.asarray(value)) for name, value in logs.items()}
