"""Turning ``fit``/``evaluate``/``predict``'s data arguments into checked input sources.

Every input goes through :func:`tfdist.data.inputs.as_input` (which fixes the
global batch size and how each worker reads its share) and is checked against
the model's inputs, so that a mismatch fails here with the argument's name,
not inside a traced step.
"""

from __future__ import annotations

import logging
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tfdist.config import check_positive_int, invalid_argument
from tfdist.data.inputs import (
    DEFAULT_GLOBAL_BATCH_SIZE,
    InputSource,
    as_input,
    check_evaluation_steps,
)
from tfdist.models import check_features
from tfdist.strategies.base import Runner

logger = logging.getLogger(__name__)


def input_source(
    data: Any,
    *,
    runner: Runner,
    model: keras.Model,
    global_batch_size: int | None,
    training: bool,
    argument: str,
    fallback_global_batch_size: int | None = None,
) -> InputSource:
    """``data`` as an ``InputSource`` for ``runner``, checked against ``model``'s inputs."""
    source = as_input(
        data,
        input_context=runner.input_context(),
        global_batch_size=global_batch_size,
        training=training,
        argument=argument,
        fallback_global_batch_size=fallback_global_batch_size,
    )
    check_features(model, source.element_spec, argument=argument)
    return source


def fit_sources(
    data: Any,
    validation_data: Any,
    *,
    runner: Runner,
    model: keras.Model,
    global_batch_size: int | None,
    steps_per_epoch: int | None,
    validation_steps: int | None,
) -> tuple[InputSource, int, InputSource | None]:
    """``fit``'s training and validation sources and its micro-batches per epoch.

    Raises:
        ValueError: If the epoch length is unknown and ``steps_per_epoch`` not
            given, or ``validation_steps`` does not fit the validation data.
    """
    source = input_source(
        data,
        runner=runner,
        model=model,
        global_batch_size=global_batch_size,
        training=True,
        argument="data",
    )
    steps = steps_per_epoch or source.steps_per_epoch
    if steps_per_epoch and source.steps_per_epoch and steps_per_epoch > source.steps_per_epoch:
        logger.info(
            "steps_per_epoch=%d is more than one pass over the data (%d batches): "
            "the data repeats.",
            steps_per_epoch,
            source.steps_per_epoch,
        )
    if steps is None:
        raise invalid_argument(
            "steps_per_epoch",
            None,
            "a positive integer",
            note="The data's length is unknown (e.g. a repeated dataset).",
        )
    val_source = None
    if validation_data is not None:
        # Validation batches default to the training ones, as in Keras.
        val_source = input_source(
            validation_data,
            runner=runner,
            model=model,
            global_batch_size=global_batch_size or source.global_batch_size,
            training=False,
            argument="validation_data",
        )
        check_evaluation_steps("validation_steps", validation_steps, val_source)
    return source, steps, val_source


def evaluate_source(
    data: Any,
    *,
    runner: Runner,
    steps: int | None,
    global_batch_size: int | None,
    fallback_global_batch_size: int | None,
) -> InputSource:
    """``evaluate``'s input, ``steps`` checked against it (an unbound batch size: the fallback)."""
    check_positive_int("steps", steps, allow_none=True)
    source = as_input(
        data,
        input_context=runner.input_context(),
        global_batch_size=global_batch_size,
        training=False,
        argument="data",
        fallback_global_batch_size=fallback_global_batch_size,
    )
    check_evaluation_steps("steps", steps, source)
    return source


def predict_source(
    data: Any, *, runner: Runner, model: keras.Model, global_batch_size: int | None
) -> tuple[InputSource, str]:
    """``predict``'s inputs (``x`` alone: ``y`` and weights dropped; arrays batched), its type.

    A tuple or list of as many arrays as the model has inputs (more than one) is ``x``, as in
    Keras's ``predict``; another 2- or 3-tuple is ``(x, y[, sample_weight])``.
    """
    several = _inputs_list(model, data)
    if not several and isinstance(data, (tuple, list)) and 2 <= len(data) <= 3:
        data = data[0]
    if several or isinstance(data, (np.ndarray, dict)) or hasattr(data, "__array__"):
        gbs = global_batch_size or DEFAULT_GLOBAL_BATCH_SIZE
        x = tuple(data) if several else data
        # Elements (x,): a tuple x stays x, not (x, y).
        data = tf.data.Dataset.from_tensor_slices((x,)).batch(gbs)
    source = input_source(
        data,
        runner=runner,
        model=model,
        global_batch_size=global_batch_size,
        training=False,
        argument="data",
    )
    return source, type(data).__name__


def _inputs_list(model: keras.Model, data: Any) -> bool:
    """Whether ``data`` is a tuple or list of arrays, one for each of the model's inputs."""
    try:
        num_inputs = len(model.inputs or ())
    except (AttributeError, ValueError):
        return False  # not built: a 2- or 3-tuple is (x, y[, sample_weight])
    return (
        num_inputs > 1
        and isinstance(data, (tuple, list))
        and len(data) == num_inputs
        and all(isinstance(a, np.ndarray) or hasattr(a, "__array__") for a in data)
    )
