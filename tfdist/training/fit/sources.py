"""Turning ``fit``/``evaluate``/``predict``'s data arguments into checked input sources.

Every input goes through `tfdist.data.inputs.as_input` (which fixes the
global batch size and how each worker reads its share) and is checked against
the model's inputs, so that a mismatch fails here with the argument's name,
not inside a traced step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from tfdist.config import check_positive_int, invalid_argument
from tfdist.data.dataset_fn import DatasetFn
from tfdist.data.inputs import (
    DEFAULT_GLOBAL_BATCH_SIZE,
    InputSource,
    Reading,
    as_input,
    check_evaluation_steps,
)
from tfdist.models import check_features
from tfdist.strategies.base import Runner
from tfdist.training.fit import keras_data as fit_data
from tfdist.training.fit.arguments import FitArguments
from tfdist.training.fit.keras_data import is_dataset_like
from tfdist.training.step.model_steps import Overrides

logger = logging.getLogger(__name__)


def input_source(
    data: Any,
    reading: Reading,
    *,
    runner: Runner,
    model: keras.Model,
    global_batch_size: int | None,
    targets_where: str | None = None,
) -> InputSource:
    """``data`` read as ``reading`` says (`tfdist.data.inputs.as_input`), as an ``InputSource``
    for ``runner``, checked against ``model``'s inputs (and, given ``targets_where``, to carry
    targets when the model has a loss: `check_targets`)."""
    source = as_input(
        data, reading, input_context=runner.input_context(), global_batch_size=global_batch_size
    )
    if targets_where is not None:
        check_targets(model, source, where=targets_where)
    check_features(model, source.element_spec, argument=reading.argument)
    return source


def fit_sources(
    data: Any,
    validation_data: Any,
    args: FitArguments,
    *,
    runner: Runner,
    model: keras.Model,
    build: Callable[[InputSource], None],
) -> tuple[InputSource, int | None, InputSource | None]:
    """``fit``'s training and validation sources and its micro-batches per epoch (None: each
    epoch runs until the data is exhausted).

    Args:
        data: ``x``, ``y`` and ``sample_weight`` packed by `fit_data.keras_data`.
        validation_data: As for ``Trainer.fit``.
        args: ``fit``'s other arguments, checked.
        runner, model: Where and what is trained.
        build: Builds the model from a source (``class_weight`` reads its output).

    Raises:
        ValueError: If the epoch length is unknown and ``steps_per_epoch`` not
            given, or ``validation_steps`` does not fit the validation data, or
            a data argument does not fit the data (see `fit_data`).
    """
    if args.validation_split:
        if validation_data is not None:
            raise invalid_argument(
                "validation_split",
                args.validation_split,
                "0.0 when validation_data is given",
                note="Keras would use validation_data and ignore the split; pass one of them.",
            )
        data, validation_data = fit_data.split_for_validation(data, args.validation_split)
    fit_data.warn_unused_shuffle(data, args.shuffle)
    gbs = args.global_batch_size
    if gbs is None and args.steps_per_epoch and not is_dataset_like(data):
        replicas = runner.input_context().num_replicas_in_sync
        gbs = fit_data.keras_batch_size(data, args.steps_per_epoch, replicas)
    source = input_source(
        data,
        Reading(training=True, argument="x", shuffle=args.shuffle),
        runner=runner,
        model=model,
        global_batch_size=gbs,
        targets_where="the elements of x" if is_dataset_like(data) else "the arrays x",
    )
    if source.in_process and not runner.reads_training_input_here:
        raise invalid_argument(
            "x",
            "a Python generator or keras.utils.PyDataset",
            "a tf.data.Dataset, a dataset_fn or arrays under strategy 'parameter_server'",
            note="Its batches come from Python code in this process, and the workers that "
            "train are other processes, which read their data themselves; build the input "
            "with tf.data (e.g. a dataset_fn reading files or arrays).",
        )
    if args.class_weight is not None:
        build(source)
        source = fit_data.weighted_by_class(source, args.class_weight, model)
    steps = _steps_per_epoch(args.steps_per_epoch, source)
    val_source = None
    if validation_data is not None:
        val_source = _validation_input(
            validation_data, args, runner=runner, model=model, training_source=source
        )
    return source, steps, val_source


def _validation_input(
    validation_data: Any,
    args: FitArguments,
    *,
    runner: Runner,
    model: keras.Model,
    training_source: InputSource,
) -> InputSource:
    """``fit``'s validation source, batched by ``validation_batch_size`` or else as the training
    data is (as in Keras), read for ``validation_steps`` (checked against it)."""
    val_source = validation_source(validation_data, args, runner=runner, model=model)
    val_source = val_source or input_source(
        validation_data,
        Reading(training=False, argument="validation_data", steps=args.validation_steps),
        runner=runner,
        model=model,
        global_batch_size=args.global_batch_size or training_source.global_batch_size,
    )
    check_evaluation_steps("validation_steps", args.validation_steps, val_source)
    return val_source


def check_targets(model: keras.Model, source: InputSource, *, where: str) -> None:
    """Data without targets only for a model whose loss is its own (``add_loss``), as in Keras.

    A model compiled with a loss needs targets; Keras would fail inside its first step.
    ``where`` names the data in the error, e.g. ``"the arrays x"``.

    Raises:
        ValueError: Naming ``y``, for data without targets and a model with a compiled loss.
    """
    spec = source.element_spec
    has_y = isinstance(spec, tuple) and len(spec) >= 2
    if has_y or getattr(model, "loss", None) is None or Overrides.of(model).train_step:
        return
    raise invalid_argument(
        "y",
        None,
        f"the targets for {where}",
        note="Pass y with arrays, or (x, y[, sample_weight]) elements in a dataset; only a "
        "model compiled without a loss (its own add_loss) trains on x alone.",
    )


def validation_source(
    validation_data: Any, args: FitArguments, *, runner: Runner, model: keras.Model
) -> InputSource | None:
    """The validation source batched by ``validation_batch_size``, or None when it is not given.

    Raises:
        ValueError: Naming ``validation_batch_size`` for data tfdist does not
            batch (a ``tf.data.Dataset`` or a dataset_fn), as Keras refuses it.
    """
    if args.validation_batch_size is None:
        return None
    if is_dataset_like(validation_data) and not isinstance(validation_data, DatasetFn):
        raise invalid_argument(
            "validation_batch_size",
            args.validation_batch_size,
            f"None when validation_data is {fit_data.kind_of(validation_data)}",
            note="It is batched already; only arrays and tfdist.data.DatasetFn are batched here.",
        )
    return input_source(
        validation_data,
        Reading(training=False, argument="validation_data", steps=args.validation_steps),
        runner=runner,
        model=model,
        global_batch_size=args.validation_batch_size,
    )


def runs_until_exhausted(source: InputSource) -> bool:
    """Whether one pass over ``source`` ends only when its data does: a dataset of global
    batches (or a generator) of unknown length, which Keras reads until it is exhausted."""
    if source.dataset is None or source.steps_per_epoch is not None:
        return False
    return int(source.dataset.cardinality()) == tf.data.UNKNOWN_CARDINALITY


def _steps_per_epoch(steps_per_epoch: int | None, source: InputSource) -> int | None:
    """The micro-batches of one epoch: ``steps_per_epoch``, or one pass over ``source``;
    None for a pass of unknown length, run until the data is exhausted, as in Keras."""
    if steps_per_epoch is None and runs_until_exhausted(source):
        return None
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
            note="A dataset_fn's pass has an unknown length here: each worker's pipeline could "
            "end at another step (only datasets of global batches and generators run until "
            "exhausted)."
            if source.dataset_fn is not None
            else "The data never ends (e.g. a repeated dataset or an endless PyDataset).",
        )
    return steps


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
        Reading(training=False, argument="x", steps=steps),
        input_context=runner.input_context(),
        global_batch_size=global_batch_size,
        fallback_global_batch_size=fallback_global_batch_size,
    )
    check_evaluation_steps("steps", steps, source)
    return source


def predict_source(
    data: Any, *, runner: Runner, model: keras.Model, global_batch_size: int | None
) -> tuple[InputSource, str]:
    """``predict``'s inputs (``x`` alone: ``y`` and weights dropped; arrays batched), its type.

    A tuple or list of as many arrays as the model has inputs (more than one) is ``x``, as in
    Keras's ``predict``; for a single-input model a 2- or 3-tuple is tfdist's older
    ``(x, y[, sample_weight])`` form.
    """
    several = _inputs_list(model, data)
    try:
        single_input = len(model.inputs) == 1
    except (AttributeError, ValueError):  # not built: a subclassed model
        single_input = True
    if not several and single_input and isinstance(data, tuple) and 2 <= len(data) <= 3:
        data = data[0]
    if isinstance(data, list):
        data = tuple(data)  # one array per input, not one stacked array
    if several or not is_dataset_like(data):
        gbs = global_batch_size or DEFAULT_GLOBAL_BATCH_SIZE
        x = tuple(data) if several else data
        # Elements (x,): a tuple x stays x, not (x, y).
        data = tf.data.Dataset.from_tensor_slices((x,)).batch(gbs)
    source = input_source(
        data,
        Reading(training=False, argument="x"),
        runner=runner,
        model=model,
        global_batch_size=global_batch_size,
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
        and all(hasattr(a, "__array__") for a in data)
    )
