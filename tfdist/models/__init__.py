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
from collections.abc import Callable
from typing import Any

import keras

from tfdist.config import ModelName, check_positive_int, invalid_argument
from tfdist.models import cnn, mlp, resnet, transformer

_BUILDERS: dict[str, Callable[..., keras.Model]] = {
    "mlp": mlp.build,
    "cnn": cnn.build,
    "resnet": resnet.build,
    "transformer": transformer.build,
}


def available() -> tuple[str, ...]:
    """Returns the registered model names, sorted."""
    return tuple(sorted(_BUILDERS))


def get(
    name: ModelName,
    *,
    input_shape: tuple[int, ...] = (8, 8, 1),
    num_classes: int = 10,
    **kwargs: Any,
) -> keras.Model:
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
    accepted = [
        p.name for p in inspect.signature(builder).parameters.values() if p.kind is p.KEYWORD_ONLY
    ]
    for key in sorted(set(kwargs) - set(accepted)):
        raise invalid_argument(
            key, kwargs[key], f"an option of model {name!r}: {', '.join(accepted)}"
        )
    input_shape = tuple(input_shape)
    if not input_shape or any(
        isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in input_shape
    ):
        raise invalid_argument(
            "input_shape", input_shape, "a non-empty tuple of positive ints, e.g. (8, 8, 1)"
        )
    check_positive_int("num_classes", num_classes)
    return builder(input_shape, num_classes, **kwargs)


def check_features(model: keras.Model, element_spec: Any, *, argument: str = "data") -> None:
    """Raises if the batches' features cannot feed ``model``'s single input.

    A mismatch would otherwise surface as a TensorFlow error from inside the
    compiled step. Models with several inputs, or not yet built, are not checked.

    Args:
        model: The model to train or evaluate.
        element_spec: One batch's spec: ``(x, y[, sample_weight])`` or ``x``.
        argument: The data argument's name, for the message.

    Raises:
        ValueError: If ``x``'s per-example shape differs from the model's input shape.
    """
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):
        return
    x = element_spec[0] if isinstance(element_spec, (tuple, list)) else element_spec
    if not inputs or len(inputs) != 1 or not hasattr(x, "shape") or x.shape.rank is None:
        return
    want, got = tuple(inputs[0].shape[1:]), tuple(x.shape[1:])
    if len(want) != len(got) or any(
        w is not None and g is not None and w != g for w, g in zip(want, got)
    ):
        raise invalid_argument(
            argument,
            f"batches of x with shape {(None, *got)}",
            f"x of shape {(None, *want)}, the input shape of model {model.name!r}",
        )


__all__ = ["ModelName", "available", "check_features", "get"]
