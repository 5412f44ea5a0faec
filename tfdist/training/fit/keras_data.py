"""Keras's data arguments (``x``, ``y``, ``sample_weight``, ...) into what ``as_input`` takes.

``Trainer.fit``/``evaluate``/``predict`` take Keras's words; `keras_data`
packs them into the one ``data`` value `tfdist.data.inputs.as_input`
reads: a dataset-like ``x`` as it is, arrays as an ``(x, y[, sample_weight])``
tuple (each part an array or a dict/list of arrays, one per input or output).
`split_for_validation` is Keras's ``validation_split`` and
`weighted_by_class` its ``class_weight``, each refusing what Keras refuses.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tfdist.config import invalid_argument
from tfdist.data.dataset_fn import DatasetFn
from tfdist.data.inputs import InputSource
from tfdist.data.python_inputs import is_python_input
from tfdist.data.python_inputs import kind_of as python_kind_of

logger = logging.getLogger(__name__)


def is_dataset_like(x: Any) -> bool:
    """Whether ``x`` carries its own targets: a dataset, a ``DatasetFn``, a dataset_fn, a
    Python generator or a ``keras.utils.PyDataset``."""
    return (
        isinstance(x, (tf.data.Dataset, DatasetFn))
        or is_python_input(x)
        or (callable(x) and not hasattr(x, "__array__"))
    )


def kind_of(x: Any) -> str:
    """How an error names ``x``'s kind."""
    if is_python_input(x):
        return python_kind_of(x)
    if isinstance(x, DatasetFn):
        return "a tfdist.data.DatasetFn"
    if isinstance(x, tf.data.Dataset):
        return "a tf.data.Dataset"
    return "a dataset_fn"


def keras_data(x: Any, y: Any, sample_weight: Any, *, needs_y: bool = True) -> Any:
    """``x``, ``y`` and ``sample_weight`` as one ``data`` for ``as_input``.

    ``x`` given alone as an ``(x, y[, sample_weight])`` tuple of arrays is
    unpacked as Keras unpacks a dataset element (tfdist's older ``fit((x, y))``).
    A single ``sample_weight`` array with several outputs in ``y`` weights each
    output, as Keras does.

    Arrays without ``y`` are ``(x,)`` (``needs_y=False``: ``x`` as it is).

    Raises:
        ValueError: For ``y``/``sample_weight`` next to a dataset-like ``x``, or no ``x``.
    """
    if x is None:
        raise invalid_argument("x", None, "the inputs: arrays, a dataset or a dataset_fn")
    if is_dataset_like(x):
        for name, value in (("y", y), ("sample_weight", sample_weight)):
            if value is not None:
                raise invalid_argument(
                    name,
                    type(value).__name__,
                    f"None when x is {kind_of(x)}",
                    note=f"Its elements carry the {'targets' if name == 'y' else 'weights'}, "
                    "as (x, y[, sample_weight]) tuples.",
                )
        return x
    if y is None and sample_weight is None and isinstance(x, tuple) and 2 <= len(x) <= 3:
        return x
    if not isinstance(x, (dict, list, tuple)) and not hasattr(x, "__array__"):
        return x  # not data at all: as_input names what it takes
    if y is None:
        # x alone: (x,), as Keras unpacks it (a model whose only loss is add_loss, compiled
        # without loss); a model with a compiled loss is refused once the model is known
        # (sources.check_targets).
        return (x,) if needs_y else x
    if sample_weight is None:
        return (x, y)
    if tf.nest.is_nested(y) and not tf.nest.is_nested(sample_weight):
        sample_weight = tf.nest.map_structure(lambda _: sample_weight, y)
    return (x, y, sample_weight)


def split_for_validation(data: Any, validation_split: float) -> tuple[Any, Any]:
    """Keras's ``validation_split``: the last fraction of the arrays, before any shuffling.

    Raises:
        ValueError: Naming ``validation_split``, for a dataset-like input or a
            split that leaves either part empty.
    """
    if is_dataset_like(data):
        raise invalid_argument(
            "validation_split",
            validation_split,
            f"0.0 when x is {kind_of(data)}",
            note="Only arrays can be split, as in Keras; pass validation_data instead.",
        )
    arrays = tf.nest.map_structure(np.asarray, data)
    n = len(tf.nest.flatten(arrays)[0])
    split_at = int(math.floor(n * (1.0 - validation_split)))  # Keras's index
    if split_at in (0, n):
        raise invalid_argument(
            "validation_split",
            validation_split,
            f"a fraction that leaves both parts of the {n} examples non-empty",
        )
    train = tf.nest.map_structure(lambda a: a[:split_at], arrays)
    return train, tf.nest.map_structure(lambda a: a[split_at:], arrays)


def keras_batch_size(data: Any, steps_per_epoch: int, replicas: int) -> int:
    """Keras's batch for arrays given ``steps_per_epoch`` but no ``batch_size``: one pass per epoch.

    Raises:
        ValueError: Naming ``batch_size`` if that batch does not split across ``replicas``.
    """
    n = len(np.asarray(tf.nest.flatten(data)[0]))
    batch = math.ceil(n / steps_per_epoch)
    if batch % replicas:
        raise invalid_argument(
            "batch_size",
            None,
            f"a multiple of the {replicas} replicas in sync when steps_per_epoch is given "
            "without it",
            note=f"Keras would use ceil({n} / {steps_per_epoch}) = {batch} examples per step, "
            "which cannot be split evenly; pass batch_size.",
        )
    logger.info(
        "batch_size=None, steps_per_epoch=%d: %d examples per step, as Keras.",
        steps_per_epoch,
        batch,
    )
    return batch


def warn_unused_shuffle(x: Any, shuffle: bool | str) -> None:
    """``shuffle`` for data tfdist does not batch: ignored, with Keras's warning; refused for a
    ``DatasetFn``, which always shuffles training batches. A ``PyDataset``'s batch order is
    shuffled (seeded), as Keras shuffles it."""
    if isinstance(x, DatasetFn):
        if shuffle is not True:
            raise invalid_argument(
                "shuffle",
                shuffle,
                "True when x is a tfdist.data.DatasetFn",
                note="It shuffles its training batches itself (seeded, reshuffled each epoch).",
            )
    elif shuffle and is_dataset_like(x) and not isinstance(x, keras.utils.PyDataset):
        logger.warning(
            "shuffle=%r is ignored: x is %s, which is expected to %s already shuffled, as Keras "
            "says.",
            shuffle,
            kind_of(x),
            "yield batches" if is_python_input(x) else "be (e.g. with .shuffle(buffer_size))",
        )


def num_classes(model: keras.Model) -> int:
    """The classes of a single-output classifier: the last dimension, 2 for one unit."""
    units = model.outputs[0].shape[-1]
    return 2 if units == 1 else int(units)


def weighted_by_class(
    source: InputSource, class_weight: dict[int, float], model: keras.Model
) -> InputSource:
    """``source`` with Keras's ``class_weight`` as each batch's sample weights.

    As Keras: ``y`` of rank 1 holds class indices, one-hot ``y`` is read with
    ``argmax``, a last dimension of 1 is rounded; a class not in
    ``class_weight`` weighs 1. ``model`` must be built.

    Raises:
        ValueError: Naming ``class_weight``: with sample weights, several
            outputs, or a key that is not a class of the model.
    """
    spec = source.element_spec
    y_spec = spec[1] if isinstance(spec, tuple) and len(spec) >= 2 else None
    if len(model.outputs) > 1 or tf.nest.is_nested(y_spec):
        raise invalid_argument(
            "class_weight",
            class_weight,
            "None for a model with several outputs",
            note="As in Keras, class weights need one output; pass sample_weight per output.",
        )
    if y_spec is None or len(spec) == 3:
        why = "sample weights" if y_spec is not None else "no targets"
        raise invalid_argument(
            "class_weight", class_weight, f"None for data with {why}", note="Keras refuses both."
        )
    classes = num_classes(model)
    unknown = sorted(k for k in class_weight if k >= classes)
    if unknown:
        raise invalid_argument(
            "class_weight",
            class_weight,
            f"keys that are classes of the model's output, 0 to {classes - 1}",
            note=f"No class {unknown[0]}.",
        )
    table = tf.constant([class_weight.get(c, 1.0) for c in range(classes)], tf.float32)

    def add_weights(x: Any, y: tf.Tensor) -> tuple[Any, tf.Tensor, tf.Tensor]:
        if y.shape.rank >= 2 and y.shape[-1] != 1:
            classes_of = tf.argmax(y, axis=-1, output_type=tf.int32)
        else:
            squeezed = tf.reshape(y, tf.shape(y)[:1]) if y.shape.rank >= 2 else y
            classes_of = tf.cast(tf.round(tf.cast(squeezed, tf.float32)), tf.int32)
        return x, y, tf.gather(table, classes_of)

    weight_spec = tf.TensorSpec(y_spec.shape[:1], tf.float32)
    return source.mapped(add_weights, (spec[0], y_spec, weight_spec))
