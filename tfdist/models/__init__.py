"""Plain Keras 3 model builders that know nothing of strategies.

    import tfdist
    with strategy.scope():
        model = tfdist.models.get("cnn", input_shape=(8, 8, 1), num_classes=10)

Every model ends in ``Dense(num_classes, dtype="float32")`` and outputs logits,
so losses stay float32 under mixed precision; every other layer follows the
global dtype policy.

Modules, one builder each (``get(name)`` finds them):

- ``cnn``: two 3x3 convs, max-pool, Dense (the digits default).
- ``convnet``: a convnet whose size does not grow with the image (global max-pool).
- ``mlp``: Flatten, Dense ReLU layers.
- ``resnet``: a small residual network with BatchNorm.
- ``gpt``: a decoder-only transformer language model (byte-level by default), blocks named
  ``block_0``, ``block_1``, ... so a pipeline can cut between them.
- ``transformer``: a small Transformer encoder that classifies an image row by row.
- ``language``: not a builder: a byte-level language model's ``BitsPerByte`` and ``generate``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import keras

from tfdist.config import ModelName, check_positive_int, invalid_argument
from tfdist.models import cnn, convnet, gpt, mlp, resnet, transformer

_BUILDERS: dict[str, Callable[..., keras.Model]] = {
    "mlp": mlp.build,
    "cnn": cnn.build,
    "convnet": convnet.build,
    "resnet": resnet.build,
    "transformer": transformer.build,
    "gpt": gpt.build,
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
        name: One of `available`.
        input_shape: Per-example feature shape, without the batch dimension.
        num_classes: Number of output logits.
        **kwargs: Model options, e.g. ``hidden_units`` for "mlp", ``dropout``
            for "cnn", ``filters`` for "convnet", ``num_blocks`` for "resnet", ``num_layers`` for
            "transformer", ``width``, ``depth`` and ``heads`` for "gpt".

    Returns:
        A built functional ``keras.Model`` outputting float32 logits
        of shape ``(batch, num_classes)`` ("gpt": ``(batch, seq_len, num_classes)``).

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


def _input_structure(model: keras.Model) -> Any:
    """The model's inputs: a KerasTensor, a list or a dict of them; None if not known yet."""
    try:
        return model.input  # a functional model's own structure (dict, list or one tensor)
    except (AttributeError, ValueError):
        pass
    try:
        inputs = model.inputs  # e.g. a Sequential made with keras.Input
    except (AttributeError, ValueError):
        return None
    if not inputs:
        return None
    return inputs[0] if len(inputs) == 1 else list(inputs)


def _missing_keys(model: keras.Model, want: list[str], x: dict, argument: str) -> None:
    missing = sorted(set(want) - set(x))
    if missing:
        raise invalid_argument(
            argument,
            f"batches whose x has the keys {sorted(x)}",
            f"x with a key for each input of model {model.name!r}: {sorted(want)}",
            note=f"Missing: {', '.join(map(repr, missing))}.",
        )


def _paired_inputs(model: keras.Model, want: Any, x: Any, argument: str) -> list[tuple]:
    """``(label, model input, x's spec)`` for each input, as Keras's functional model pairs them.

    Raises for a missing key or a wrong count; returns [] where Keras reconciles the structures
    itself in ways not checked here.
    """
    if isinstance(want, dict):
        if not isinstance(x, dict):
            return []
        _missing_keys(model, list(want), x, argument)
        return [(f"x[{k!r}]", want[k], x[k]) for k in want]
    if isinstance(want, (list, tuple)):
        names = [t.name for t in want]
        if isinstance(x, dict):  # Keras takes a dict for a list of named inputs
            _missing_keys(model, names, x, argument)
            return [(f"x[{n!r}]", t, x[n]) for n, t in zip(names, want)]
        if not isinstance(x, (list, tuple)):
            if len(want) == 1:
                return [("x", want[0], x)]
            x = [x]
        if len(x) != len(want):
            raise invalid_argument(
                argument,
                f"batches whose x holds {len(x)} tensor(s)",
                f"x with {len(want)} tensors (a list, or a dict keyed {names}), the inputs "
                f"of model {model.name!r}",
                note="A dataset element (a, b) reads as (x, y), as in Keras: give x as ((a, b),) "
                "or ((a, b), y).",
            )
        return [(f"x[{i}]", t, spec) for i, (t, spec) in enumerate(zip(want, x))]
    if isinstance(x, dict):
        _missing_keys(model, [want.name], x, argument)
        return [(f"x[{want.name!r}]", want, x[want.name])]
    if isinstance(x, (list, tuple)):
        return [("x[0]", want, x[0])] if len(x) == 1 else []
    return [("x", want, x)]


def _shapes_fit(want: tuple, got: tuple) -> bool:
    if len(got) == len(want) + 1 and got[-1] == 1:  # Keras squeezes a trailing 1 ...
        got = got[:-1]
    elif len(got) + 1 == len(want) and want[-1] == 1:  # ... or adds one
        want = want[:-1]
    return len(want) == len(got) and all(
        w is None or g is None or w == g for w, g in zip(want, got)
    )


def check_features(model: keras.Model, element_spec: Any, *, argument: str = "data") -> None:
    """Raises if the batches' features cannot feed ``model``'s inputs.

    A mismatch would otherwise surface as a TensorFlow error from inside the
    compiled step. Checks a single input, a list and a dict of inputs the way
    Keras's functional model pairs them with ``x`` (a dict ``x`` may also feed
    a list of named inputs; extra keys are ignored, as Keras does). Models not
    yet built are not checked.

    Args:
        model: The model to train or evaluate.
        element_spec: One batch's spec: ``(x, y[, sample_weight])`` or ``x``.
        argument: The data argument's name, for the message.

    Raises:
        ValueError: If ``x`` lacks an input the model needs (a key, or a tensor
            of a list), or an input's per-example shape differs from the model's.
    """
    want = _input_structure(model)
    if want is None:
        return
    x = element_spec[0] if isinstance(element_spec, tuple) else element_spec
    for label, tensor, spec in _paired_inputs(model, want, x, argument):
        if not hasattr(spec, "shape") or spec.shape.rank is None:
            continue
        want_shape, got = tuple(tensor.shape[1:]), tuple(spec.shape[1:])
        if not _shapes_fit(want_shape, got):
            raise invalid_argument(
                argument,
                f"batches of {label} with shape {(None, *got)}",
                f"{label} of shape {(None, *want_shape)}, the input shape of model {model.name!r}",
            )


def _output_keys(model: keras.Model) -> list[str] | None:
    """The names a ``compile`` dict may key: a dict output's keys, else the output names."""
    try:
        outputs = model.output
    except (AttributeError, ValueError):
        outputs = None
    if isinstance(outputs, dict):
        return list(outputs)
    try:
        return list(model.output_names or []) or None
    except (AttributeError, ValueError):
        return None  # not built yet: Keras checks when it builds the loss


def check_output_keys(model: keras.Model, **per_output: Any) -> None:
    """Raises if a ``compile`` argument given as a dict has a key that names no model output.

    Keras finds such a key only at the first step (a bare ``KeyError`` for
    ``loss``), or not at all: it pairs a ``loss_weights`` dict with the losses
    by position when its keys differ. Models not yet built are not checked.

    Args:
        model: The model to compile.
        **per_output: ``compile`` arguments by name (``loss``, ``loss_weights``,
            ``metrics``, ``weighted_metrics``); only dicts are checked.

    Raises:
        ValueError: Naming the argument, its unknown keys and the model's outputs.
    """
    keys = None
    for name, value in per_output.items():
        if not isinstance(value, dict):
            continue
        keys = keys or _output_keys(model)
        unknown = sorted(set(value) - set(keys or value))
        if unknown:
            raise invalid_argument(
                name,
                f"a dict with the keys {sorted(value)}",
                f"a dict keyed by model {model.name!r}'s outputs: {keys}",
                note=f"No output is named {', '.join(map(repr, unknown))}.",
            )


__all__ = ["ModelName", "available", "check_features", "check_output_keys", "get"]
