"""Evaluation and prediction on any strategy: each example counts once, outputs in input order."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tfdist.config import invalid_argument
from tfdist.data.inputs import InputSource
from tfdist.data.release import release
from tfdist.strategies.base import STEPS_RUN_KEY
from tfdist.training.fit.one_epoch import reset_metrics
from tfdist.training.fit.sources import check_targets, runs_until_exhausted
from tfdist.training.functions import StepFunctions


def _progress_bar(functions: StepFunctions, steps: int | None, verbose: int) -> Any:
    """Keras's progress bar for ``verbose`` 1 (a bar) or 2 (one line at the end), chief only."""
    if not verbose or not functions.runner.is_chief:
        return None
    return keras.utils.Progbar(steps, verbose=verbose)


def evaluate(
    functions: StepFunctions,
    source: InputSource,
    steps: int | None,
    *,
    steps_per_execution: int,
    verbose: int = 0,
    callbacks: keras.callbacks.CallbackList | None = None,
) -> dict[str, float]:
    """Evaluates on ``steps`` batches of ``source`` (default one pass); returns the metrics.

    Args:
        functions: The model's compiled functions (and its runner).
        source: The evaluation input, batched globally.
        steps: Batches to evaluate, or None for one pass.
        steps_per_execution: Batches per call.
        verbose: 0 silent, 1 a progress bar, 2 one line (``model.evaluate``'s).
        callbacks: Their test hooks are called as Keras's ``evaluate`` does
            (``on_test_batch_begin``/``end`` once per call, with its first
            and last batch index), e.g. by ``fit``'s validation.

    Raises:
        ValueError: If ``steps`` is None and the input's length is unknown.
    """
    steps = steps or source.steps_per_epoch
    if steps is None and not runs_until_exhausted(source):
        raise invalid_argument(
            "validation_steps",
            None,
            "a positive integer",
            note="The evaluation data never ends (e.g. a repeated dataset).",
        )
    runner = functions.runner
    check_targets(functions.model, source, where="the evaluation data")
    functions.build(source)
    # Data of unknown length may end before `steps` (validation_steps): stop there, as Keras.
    until_exhausted = runs_until_exhausted(source)
    fn = functions.evaluation(until_exhausted=until_exhausted)
    iterator = runner.make_iterator(runner.distribute(source, training=False))
    hooks = callbacks if callbacks is not None else keras.callbacks.CallbackList()
    hooks.on_test_begin()
    reset_metrics(runner, functions.model)
    logs: dict[str, float] = {}
    done = 0
    bar = _progress_bar(functions, steps, verbose)
    while steps is None or done < steps:
        n = steps_per_execution if steps is None else min(steps_per_execution, steps - done)
        hooks.on_test_batch_begin(done)
        logs = dict(functions.run(fn, iterator, n))
        ran = int(logs.pop(STEPS_RUN_KEY, n))  # fewer: data of unknown length ran out
        done += ran
        if ran:
            if bar is not None:
                last = ran < n or (steps is not None and done >= steps)
                bar.update(done, list(logs.items()), finalize=last)
            hooks.on_test_batch_end(done - 1, logs)
        if ran < n:
            break
    # Parameter servers: scheduled calls may still be running; their metric updates count.
    runner.join()
    hooks.on_test_end(logs)
    if runner.reads_training_input_here:
        # Deleting it waits for tf.data's autotuning (20-50 ms a validation on the digits, the
        # process idle): another thread does, as the training loop lets go of its iterators.
        release(iterator)
    return logs


def predict(
    functions: StepFunctions,
    source: InputSource,
    steps: int | None,
    *,
    shown: str,
    verbose: int = 0,
    callbacks: keras.callbacks.CallbackList | None = None,
) -> Any:
    """The model's outputs on ``steps`` batches of ``source`` (default all), in input order.

    Args:
        functions: The model's compiled functions (and its runner).
        source: The inputs, batched globally; ``y`` and sample weights are ignored.
        steps: Batches to predict, or None for all.
        shown: How the user's data is named in an error (its type name).
        verbose: 0 silent, 1 a progress bar, 2 one line (``model.predict``'s).
        callbacks: Their predict hooks are called as Keras's ``predict`` calls
            them, once per batch (``on_predict_batch_end`` gets ``{"outputs": ...}``).

    Returns:
        NumPy outputs (a structure of them for a multi-output model), one row
        per input example. Each step's outputs are concatenated in replica
        order: input order with one input pipeline (one_device, mirrored;
        parameter_server predicts on the coordinator). With several workers
        that holds when each global batch is split over the replicas in order;
        a dataset_fn that shards by worker gives its own order.

    Raises:
        ValueError: If ``source`` has no batch.
    """
    model, runner = functions.model, functions.runner
    if not model.built:
        # Only the layers: prediction needs no optimizer or metrics (unlike StepFunctions.build).
        with runner.strategy.scope():
            x_spec = keras.utils.unpack_x_y_sample_weight(source.element_spec)[0]
            model.build(tf.nest.map_structure(lambda s: s.shape, x_spec))
    distributed = runner.distribute(source, training=False)
    fn = _traced_once(functions.predict(), distributed)
    outputs = []
    bar = _progress_bar(functions, steps or source.steps_per_epoch, verbose)
    hooks = callbacks if callbacks is not None else keras.callbacks.CallbackList()
    hooks.on_predict_begin()
    for batch in distributed:
        if steps is not None and len(outputs) >= steps:
            break
        hooks.on_predict_batch_begin(len(outputs))
        outputs.append(tf.nest.map_structure(np.asarray, fn(batch)))
        hooks.on_predict_batch_end(len(outputs) - 1, {"outputs": outputs[-1]})
        if bar is not None:
            bar.update(len(outputs))
    hooks.on_predict_end()
    if not outputs:
        raise invalid_argument("x", shown, "at least one batch to predict on")
    if bar is not None:
        bar.update(len(outputs), finalize=True)
    return tf.nest.map_structure(lambda *parts: np.concatenate(parts, axis=0), *outputs)


def _traced_once(fn: Any, distributed: Any) -> Any:
    """``fn`` traced for the batches' spec (any batch size), not once per batch shape.

    Batches that do not divide by the replicas give each replica its own size (a batch of 3
    on 2 replicas: 2 and 1; a last batch of 1: 1 and 0), and each new combination of shapes
    would trace the distributed predict function again (about a second each on 2 CPUs).
    """
    spec = getattr(distributed, "element_spec", None)
    if spec is None:
        return fn
    try:
        return fn.get_concrete_function(spec)
    except (TypeError, ValueError):  # a spec the function cannot take whole: trace per batch
        return fn
