"""The Keras parity harness: one row, run through plain Keras ``fit`` and through the Trainer.

A :class:`Row` names a model builder, ``compile`` arguments and ``fit`` arguments in Keras's own
words. :func:`run_keras` runs them through plain ``model.fit`` on one device (the reference);
:func:`run_trainer` builds a ``tfdist.Trainer`` from the same compile arguments and calls
``trainer.fit`` with the same fit arguments, on any strategy. :func:`assert_same` compares the
final weights and every history value, and what the row's ``inference`` (``predict``,
``evaluate``) returns after the fit.

Each call of ``row.compile()`` / ``row.fit()`` makes fresh objects (optimizers, metrics,
callbacks), so the two sides share nothing but numbers. Builders seed their initial weights, so
both sides start from the same point.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist

ATOL = 1e-5
OUTPUT = "output:"  # the npz key prefix of a Result's outputs
SYNC_STRATEGIES = ("mirrored", "multi_worker")


@dataclasses.dataclass(frozen=True)
class Row:
    """One parity case.

    Attributes:
        name: The test id (snake_case); also the key of the table in
            docs/keras-parity.md.
        model: Builds the uncompiled model, the same initial weights on every call.
        compile: Returns fresh ``model.compile`` keyword arguments.
        fit: Returns fresh ``fit`` keyword arguments, Keras names (``x``, ``y``, ``batch_size``,
            ``epochs``, ``callbacks``, ...). ``verbose=0`` is added.
        trainer: Extra ``tfdist.Trainer`` keyword arguments (tfdist's own options).
        strategies: The strategies this row runs on besides plain Keras.
        atol: Tolerance for weights and history values.
        history_keys: Compare only these history keys (None: all, and the key sets must match).
        known_gaps: Strategy name -> why the Trainer does not match Keras there yet. Its test is
            a strict xfail: it fails once the gap closes, so the entry gets removed.
        keras_fit: Keras's ``fit`` keyword arguments where they differ from ``fit`` (e.g. the
            dataset of global batches a ``dataset_fn`` row stands for); default ``fit``.
        slow: Marks the row's tests ``slow`` (more than a few seconds).
        inference: ``fn(fitted)`` after the fit, with the fitted Keras model on the reference
            side and the ``tfdist.Trainer`` on the other (they share ``predict`` and
            ``evaluate``'s arguments): name -> array, compared to ``atol`` like the weights.
        instance: The Trainer gets ``model()`` built outside the strategy scope (the model
            object a user made, adapted or compiled) rather than the builder; the weights
            compared are then those of the user's object after ``fit``.
    """

    name: str
    model: Callable[[], keras.Model]
    compile: Callable[[], dict[str, Any]]
    fit: Callable[[], dict[str, Any]]
    trainer: dict[str, Any] = dataclasses.field(default_factory=dict)
    strategies: tuple[str, ...] = ("mirrored", "multi_worker", "parameter_server")
    atol: float = ATOL
    history_keys: tuple[str, ...] | None = None
    known_gaps: dict[str, str] = dataclasses.field(default_factory=dict)
    keras_fit: Callable[[], dict[str, Any]] | None = None
    slow: bool = False
    inference: Callable[[Any], dict[str, Any]] | None = None
    instance: bool = False


def rows_on(strategy: str, rows: list[Row]) -> list[Any]:
    """``pytest.param``s of the rows that run on ``strategy``, ids = names, gaps = strict xfails."""
    return [
        pytest.param(
            row,
            id=row.name,
            marks=(
                [pytest.mark.xfail(reason=row.known_gaps[strategy], strict=True)]
                if strategy in row.known_gaps
                else []
            )
            + ([pytest.mark.slow] if row.slow else []),
        )
        for row in rows
        if strategy in row.strategies
    ]


@dataclasses.dataclass
class Result:
    """What one side of a row produced."""

    weights: list[np.ndarray]
    history: dict[str, list[float]]
    model: Any = None
    outputs: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


def fixed_weights(model: keras.Model, seed: int = 1) -> keras.Model:
    """Sets ``model``'s weights from a NumPy generator: the same start in every process and state.

    Keras's own initializers draw from TF's random state, which other tests in the same
    process (and where a strategy puts the variables) can move.
    """
    rng = np.random.default_rng(seed)
    model.set_weights([0.3 * rng.standard_normal(w.shape).astype(w.dtype) for w in model.weights])
    return model


def run_keras(row: Row) -> Result:
    """Plain Keras ``compile`` + ``fit`` on one device: the reference."""
    keras.utils.set_random_seed(0)
    model = row.model()
    model.compile(**row.compile())
    history = model.fit(**(row.keras_fit or row.fit)(), verbose=0)
    return Result(model.get_weights(), _floats(history.history), model, _inference(row, model))


def run_trainer(row: Row, strategy: Any) -> Result:
    """The same row through ``tfdist.Trainer(...).fit`` on ``strategy``.

    A strategy whose runner requires ``steps_per_epoch`` (parameter_server) gets one pass
    over the data when the row gives none (:func:`one_pass_steps`).
    """
    keras.utils.set_random_seed(0)
    model = row.model() if row.instance else row.model  # an instance: built outside the scope
    trainer = tfdist.Trainer(model, strategy=strategy, **row.compile(), **row.trainer)
    fit = dict(row.fit())
    if trainer.runner.requires_steps_per_epoch and fit.get("steps_per_epoch") is None:
        # A dataset_fn row counts its pass on the dataset Keras gets (row.keras_fit).
        countable = not callable(fit["x"]) or isinstance(fit["x"], tf.data.Dataset)
        fit["steps_per_epoch"] = one_pass_steps(fit if countable else row.keras_fit())
    history = fit_trainer(trainer, fit)
    # An instance row compares the user's own object: it must hold the trained weights.
    trained = model if row.instance else trainer.model
    inference = _inference(row, trainer)
    return Result(trained.get_weights(), _floats(history.history), trainer, inference)


def _inference(row: Row, fitted: Any) -> dict[str, np.ndarray]:
    """``row.inference(fitted)`` as NumPy arrays (nested outputs flattened in order)."""
    if row.inference is None:
        return {}
    return {
        name: np.concatenate([np.ravel(np.asarray(v, "float64")) for v in tf.nest.flatten(value)])
        for name, value in row.inference(fitted).items()
    }


def fit_trainer(trainer: tfdist.Trainer, fit: dict[str, Any]) -> keras.callbacks.History:
    """The one way the harness calls ``trainer.fit``: with the keywords ``model.fit`` gets."""
    return trainer.fit(**fit, verbose=0)


def one_pass_steps(fit: dict[str, Any]) -> int:
    """Batches in one pass over ``fit``'s training data, as Keras counts them.

    A dataset: its cardinality; a ``keras.utils.PyDataset``: its length. Arrays (``x`` an
    array, or a dict/list of them): ``ceil(N / batch_size)`` (Keras's default batch 32), after
    ``validation_split`` took its tail (``floor(N * (1 - split))`` training examples, as in Keras).

    Raises:
        ValueError: For a dataset of unknown or infinite length (the row must say
            ``steps_per_epoch`` itself).
    """
    x = fit["x"]
    if isinstance(x, keras.utils.PyDataset):
        return len(x)  # batches already
    if isinstance(x, tf.data.Dataset):
        n = int(x.cardinality())
        if n < 0:
            raise ValueError(
                "The row's dataset has no finite cardinality: give steps_per_epoch in its fit()."
            )
        return n
    n = len(tf.nest.flatten(x)[0])
    if fit.get("validation_split"):
        n = math.floor(n * (1.0 - fit["validation_split"]))
    return math.ceil(n / (fit.get("batch_size") or 32))


def _floats(history: dict[str, list[Any]]) -> dict[str, list[float]]:
    return {k: [float(v) for v in vs] for k, vs in history.items()}


def assert_same(row: Row, reference: Result, result: Result) -> None:
    """Final weights and every history value equal to ``row.atol``; the same history keys."""
    keys = row.history_keys
    if keys is None:
        assert sorted(result.history) == sorted(reference.history), (
            sorted(result.history),
            sorted(reference.history),
        )
        keys = tuple(reference.history)
    for key in keys:
        np.testing.assert_allclose(
            result.history[key], reference.history[key], atol=row.atol, rtol=0, err_msg=key
        )
    assert len(result.weights) == len(reference.weights)
    for got, want in zip(result.weights, reference.weights):
        np.testing.assert_allclose(got, want, atol=row.atol, rtol=0)
    assert sorted(result.outputs) == sorted(reference.outputs)
    for name, want in reference.outputs.items():
        np.testing.assert_allclose(result.outputs[name], want, atol=row.atol, rtol=0, err_msg=name)


def save_result(result: Result, prefix: str) -> None:
    """Writes ``prefix.npz`` (the weights in order, then the outputs) and ``prefix.json``."""
    np.savez(prefix + ".npz", *result.weights, **{OUTPUT + k: v for k, v in result.outputs.items()})
    with open(prefix + ".json", "w") as f:
        json.dump(result.history, f)


def load_result(prefix: str) -> Result:
    """Reads what :func:`save_result` wrote."""
    with np.load(prefix + ".npz") as f:
        outputs = {k[len(OUTPUT) :]: f[k] for k in f.files if k.startswith(OUTPUT)}
        weights = [f[f"arr_{i}"] for i in range(len(f.files) - len(outputs))]
    with open(prefix + ".json") as f:
        return Result(weights, json.load(f), outputs=outputs)
