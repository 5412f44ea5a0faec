"""Placing a model made outside the strategy scope into it."""
from __future__ import annotations

import keras

from tfdist.config import invalid_argument


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
    fix = (f"Pass a zero-arg builder (`model=lambda: {name}(...)`), pass the model before it is built (it is "
           "then built inside the scope), or build it inside `strategy.scope()`.")
    expected = "a model built inside `strategy.scope()`, an unbuilt model, or a zero-arg builder"
    if not _from_keras(type(model)) and not _defines_get_config(type(model)):
        raise invalid_argument("model", name, expected, note=(
            f"{name} is a subclassed model built outside the strategy scope, so tfdist must rebuild it there, "
            "and it defines no get_config() to rebuild it from. " + fix))
    try:
        clone = keras.models.clone_model(model)
        clone.set_weights(model.get_weights())
    except Exception as e:  # noqa: BLE001 - any failure to rebuild gets the same advice
        raise invalid_argument("model", name, expected,
                               note=f"tfdist could not rebuild it in the scope from its config ({e}). {fix}") from e
    return clone
