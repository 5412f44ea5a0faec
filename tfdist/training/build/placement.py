"""Placing the user's model in the strategy scope: as given, built there, or moved there.

A model whose variables were made outside the scope (built, adapted or compiled
before the Trainer saw it) is *moved*, not rebuilt: tfdist keeps the very
object and re-makes only its variables' storage in the scope, with the same
values (`tfdist._compat.keras_internals.scope_moves.move_variables_into_scope`). So
whatever the model holds survives as it is: adapted ``Normalization`` and
``Discretization`` state, the vocabularies and lookup tables of
``StringLookup``, ``IntegerLookup`` and ``TextVectorization``, a subclassed
model's constructor arguments and attributes, custom layers. And the user's
``model`` is ``trainer.model``: after ``fit`` it holds the trained weights.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from tfdist._compat.keras_internals.scope_moves import move_variables_into_scope, outside_scope
from tfdist.config import invalid_argument
from tfdist.training.build.precision import check_model_policy

logger = logging.getLogger(__name__)

ModelOrBuilder = keras.Model | Callable[[], keras.Model]


def created_in_scope(strategy: tf.distribute.Strategy, model: keras.Model) -> bool:
    """Whether every variable of a built ``model`` was created in ``strategy``'s scope."""
    variables = model.variables
    # A Keras variable wraps the tf.Variable the strategy made (`.value`); only that one is known.
    return bool(variables) and all(
        strategy.extended.variable_created_in_scope(getattr(v, "value", v)) for v in variables
    )


def made_outside(strategy: tf.distribute.Strategy, model: keras.Model) -> bool:
    """Whether some variable of ``model`` was made outside ``strategy``'s scope."""
    return bool(outside_scope(strategy, model.variables))


def in_scope_or_refused(
    move: Callable[[], Any], *, argument: str, received: str, expected: str, failed: str, fix: str
) -> Any:
    """``move()`` (a user's object moved or copied into the scope), or one clear error.

    Any failure becomes an ``invalid_argument`` for ``argument``: "tfdist could not
    ``failed`` (the cause)", then ``fix`` (a builder, or making the object in the scope).
    """
    try:
        return move()
    except Exception as e:  # noqa: BLE001 - any failure to move gets the same advice
        raise invalid_argument(
            argument, received, expected, note=f"tfdist could not {failed} ({e}). {fix}"
        ) from e


def move_into_scope(model: keras.Model, strategy: tf.distribute.Strategy) -> keras.Model:
    """Moves ``model``'s variables made outside ``strategy``'s scope into it; returns ``model``.

    The same object, every layer and attribute kept; only the storage of its variables is
    re-made in the scope, with the same values. The model's own compiled functions, traced
    with the old variables, are dropped (Keras makes them again when next needed).
    """
    name = type(model).__name__
    moved = in_scope_or_refused(
        lambda: move_variables_into_scope(strategy, model.variables),
        argument="model",
        received=name,
        expected="a model whose variables can be moved into the strategy scope",
        failed=f"re-make {name}'s variables in the scope",
        fix=f"Pass a zero-arg builder (`model=lambda: make_{name.lower()}()`), which runs in the "
        "scope, or build the model inside `with strategy.scope():`.",
    )
    if moved:
        logger.info(
            "%s's %d variables made outside the strategy scope were moved into it (same values, "
            "same model object).",
            model.name,
            moved,
        )
        # Public attributes of a Keras model: its fit/evaluate/predict trace them again.
        model.train_function = model.test_function = model.predict_function = None
    return model


def place_model(
    model: ModelOrBuilder | Any, strategy: tf.distribute.Strategy, precision: str
) -> keras.Model:
    """The Trainer's model, with its variables in ``strategy``'s scope; call inside the scope.

    A model instance is used as the Trainer's model, the same object: an
    unbuilt one (subclassed ones included) is built later, in the scope; one
    with variables made outside the scope is moved into it
    (`move_into_scope`). A zero-arg builder is called here, under the
    dtype policy already set, and what it returns is moved likewise when it
    was built outside the scope.
    """
    if isinstance(model, keras.Model):
        check_model_policy(model, precision)
        return move_into_scope(model, strategy)
    if callable(model):
        built = model()
        if not isinstance(built, keras.Model):
            raise invalid_argument("model", built, "a builder that returns a keras.Model")
        return move_into_scope(built, strategy)
    note = (
        f"For a built-in model pass `lambda: tfdist.models.get({model!r})`."
        if isinstance(model, str)
        else ""
    )
    raise invalid_argument(
        "model",
        model if isinstance(model, str) else type(model).__name__,
        "a keras.Model or a zero-arg builder",
        note=note,
    )
