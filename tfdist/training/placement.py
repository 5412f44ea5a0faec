"""Placing the user's model in the strategy scope: as given, built there, or rebuilt there."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from tfdist.config import invalid_argument
from tfdist.training.precision import check_model_policy

ModelOrBuilder = keras.Model | Callable[[], keras.Model]


def created_in_scope(strategy: tf.distribute.Strategy, model: keras.Model) -> bool:
    """Whether every variable of a built ``model`` was created in ``strategy``'s scope."""
    variables = model.variables
    # A Keras variable wraps the tf.Variable the strategy made (`.value`); only that one is known.
    return bool(variables) and all(
        strategy.extended.variable_created_in_scope(getattr(v, "value", v)) for v in variables
    )


def place_model(
    model: ModelOrBuilder | Any, strategy: tf.distribute.Strategy, precision: str
) -> keras.Model:
    """The Trainer's model, with its variables in ``strategy``'s scope; call inside the scope.

    A model built in the scope is used as is; an unbuilt one (subclassed ones
    included) is built later, in the scope; one built outside is rebuilt by
    :func:`rebuild_in_scope` from its config, weights included (a subclassed
    model then needs its own ``get_config``); a zero-arg builder is called
    here, under the dtype policy already set.
    """
    if isinstance(model, keras.Model):
        check_model_policy(model, precision)
        if not model.variables:
            return model  # unbuilt: its variables are made when tfdist builds it, in the scope
        if created_in_scope(strategy, model):
            return model
        return rebuild_in_scope(model)
    if callable(model):
        built = model()
        if not isinstance(built, keras.Model):
            raise invalid_argument("model", built, "a builder that returns a keras.Model")
        return built
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


def _from_keras(cls: type) -> bool:
    return cls.__module__.split(".")[0] == "keras"


def _defines_get_config(cls: type) -> bool:
    """Whether a user class (not Keras itself) overrides ``get_config``."""
    return any("get_config" in vars(c) for c in cls.__mro__ if not _from_keras(c))


def rebuild_in_scope(model: keras.Model) -> keras.Model:
    """Rebuilds a model made outside the strategy scope from its config, weights included.

    Keras's own classes (Sequential, functional) clone exactly. A subclassed
    model must define ``get_config``: Keras's automatic config of a subclass
    does not record its constructor arguments, so a clone could silently be
    another model.
    """
    name = type(model).__name__
    fix = (
        f"Pass a zero-arg builder (`model=lambda: {name}(...)`), pass the model before it is "
        "built (it is then built inside the scope), or build it inside `strategy.scope()`."
    )
    expected = "a model built inside `strategy.scope()`, an unbuilt model, or a zero-arg builder"
    if not _from_keras(type(model)) and not _defines_get_config(type(model)):
        raise invalid_argument(
            "model",
            name,
            expected,
            note=(
                f"{name} is a subclassed model built outside the strategy scope, so tfdist must "
                "rebuild it there, and it defines no get_config() to rebuild it from. " + fix
            ),
        )
    try:
        clone = keras.models.clone_model(model)
        clone.set_weights(model.get_weights())
    except Exception as e:  # noqa: BLE001 - any failure to rebuild gets the same advice
        raise invalid_argument(
            "model",
            name,
            expected,
            note=f"tfdist could not rebuild it in the scope from its config ({e}). {fix}",
        ) from e
    return clone
