"""Mixed precision: the Keras dtype policy and fp16 loss scaling."""
from __future__ import annotations

import contextlib
from typing import Iterator, Literal

import keras

from tfdist.config import PRECISIONS, check_choice, invalid_argument

Precision = Literal["float32", "mixed_float16", "mixed_bfloat16"]


def check_precision(precision: str) -> str:
    """Validates a precision name."""
    return check_choice("precision", precision, PRECISIONS)


@contextlib.contextmanager
def dtype_policy(precision: str) -> Iterator[None]:
    """Sets Keras's global dtype policy for the block, then restores it.

    Layers built inside the block compute in ``precision``'s compute dtype and
    keep float32 variables.
    """
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(precision)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def check_model_policy(model: keras.Model, precision: str) -> None:
    """Raises if an already-built model was built under another policy."""
    name = getattr(model.dtype_policy, "name", str(model.dtype_policy))
    if precision != "float32" and name != precision:
        raise invalid_argument(
            "precision", precision, f"the dtype policy the model was built with ({name!r})",
            note="Pass a zero-arg builder as `model` so tfdist builds it under the policy.")


def needs_loss_scaling(precision: str) -> bool:
    """float16 gradients underflow without loss scaling; bfloat16 and float32 don't."""
    return precision == "mixed_float16"


def wrap_optimizer(optimizer: keras.optimizers.Optimizer, precision: str) -> keras.optimizers.Optimizer:
    """Wraps ``optimizer`` in a dynamic ``LossScaleOptimizer`` for mixed_float16.

    Must run inside the strategy scope.
    """
    if needs_loss_scaling(precision) and not isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer
