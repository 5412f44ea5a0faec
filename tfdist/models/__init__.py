"""Plain Keras 3 model builders that know nothing of strategies.

    import tfdist
    with strategy.scope():
        model = tfdist.models.get("cnn", input_shape=(8, 8, 1), num_classes=10)

Every model ends in ``Dense(num_classes, dtype="float32")`` and outputs logits,
so losses stay float32 under mixed precision; every other layer follows the
global dtype policy.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Literal

import keras

from tfdist.config import check_positive_int, invalid_argument
from tfdist.models import cnn, mlp, resnet, transformer

ModelName = Literal["mlp", "cnn", "resnet", "transformer"]

_BUILDERS: dict[str, Callable[..., keras.Model]] = {
    "mlp": mlp.build,
    "cnn": cnn.build,
    "resnet": resnet.build,
    "transformer": transformer.build,
}


def available() -> tuple[str, ...]:
    """Returns the registered model names, sorted."""
    return tuple(sorted(_BUILDERS))


def get(name: ModelName, *, input_shape: tuple[int, ...] = (8, 8, 1), num_classes: int = 10,
        **kwargs: Any) -> keras.Model:
    """Builds a registered model (in the current strategy scope, if any).

    Args:
        name: One of :func:`available`.
        input_shape: Per-example feature shape, without the batch dimension.
        num_classes: Number of output logits.
        **kwargs: Model options, e.g. ``hidden_units`` for "mlp", ``dropout``
            for "cnn", ``num_blocks`` for "resnet", ``num_layers`` for
            "transformer".

    Returns:
        A built functional ``keras.Model`` outputting float32 logits
        of shape ``(batch, num_classes)``.

    Raises:
        ValueError: For an unknown name, an option the model does not take, or
            an invalid option value.
    """
    if name not in _BUILDERS:
        raise invalid_argument("model", name, available())
    builder = _BUILDERS[name]
    accepted = [p.name for p in inspect.signature(builder).parameters.values() if p.kind is p.KEYWORD_ONLY]
    for key in sorted(set(kwargs) - set(accepted)):
        raise invalid_argument(key, kwargs[key], f"an option of model {name!r}: {', '.join(accepted)}")
    input_shape = tuple(input_shape)
    if not input_shape or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in input_shape):
        raise invalid_argument("input_shape", input_shape, "a non-empty tuple of positive ints, e.g. (8, 8, 1)")
    check_positive_int("num_classes", num_classes)
    return builder(input_shape, num_classes, **kwargs)


__all__ = ["ModelName", "available", "get"]
