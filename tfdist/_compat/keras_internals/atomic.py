"""Shim ``atomic_assign_add``: Keras variable increments as one atomic TF op.

Keras variables implement ``assign_add`` as ``assign(self + value)``: a read,
then a write. Under an asynchronous ParameterServerStrategy concurrent workers
overwrite each other's increments (200 updates scheduled, ``optimizer.iterations``
counted 167), and metric totals lose updates the same way. The shim uses the TF
variable's own ``assign_add``, one atomic op on the variable's device.
"""

from __future__ import annotations

import inspect
from typing import Any

VARIABLE = "keras.src.backend.tensorflow.core:Variable"


def make_atomic(upstream: Any, method: str) -> Any:
    """``Variable.<method>`` (``assign_add`` or ``assign_sub``) as one op on the TF variable."""
    from keras.src.backend.common.stateless_scope import in_stateless_scope

    def atomic(self, value):
        if in_stateless_scope():
            return upstream(self, value)
        # Keras's own dtype conversion, then the TF variable (Keras keeps it in `_value`).
        value = self._convert_to_tensor(value, dtype=self.dtype)
        return getattr(self._value, method)(value)

    atomic.__name__ = method
    atomic.__doc__ = f"Keras ``Variable.{method}`` as one atomic TF op (tfdist shim)."
    return atomic


def keras_assign_add_is_read_then_write(fn: Any = None) -> bool:
    """True while Keras implements ``assign_add`` (or ``fn``) as a read followed by ``assign``."""
    from keras.src.backend.common.variables import Variable

    return "self.assign(self + value)" in inspect.getsource(fn or Variable.assign_add)
