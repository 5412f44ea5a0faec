"""A model the user compiled: the Trainer takes its ``compile`` arguments, or uses it as is.

``Trainer(model)`` with a model already ``compile()``d takes its optimizer,
loss, loss weights and metrics from that compile (copied into the strategy
scope with every attribute, as when they are given to the Trainer: see
`tfdist.training.build.scope`). Giving them to the Trainer as
well is an error that names the conflict: one place per setting.

A model whose class overrides ``compile`` (a GAN's
``compile(d_optimizer=..., g_optimizer=...)``) cannot be recompiled by tfdist.
It is used as compiled, provided its optimizers were made in the strategy's
scope (``with strategy.scope():`` around the model and its ``compile``, or a
builder passed as ``Trainer(lambda: ...)``, which runs in the scope).

A model that compiles itself when made (its class takes a ``compile`` constructor argument,
as KerasHub's tasks do: ``GPT2CausalLM(..., compile=True)`` compiles with its defaults) was
not compiled by the user. Given compile arguments, the Trainer compiles it again in the scope,
through its own ``compile``: the Trainer's arguments, and its compile's for the others (its
defaults), as the user's ``task.compile(optimizer=...)`` would in plain Keras.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import keras
import tensorflow as tf

from tfdist._compat.keras_internals.keras_training import compile_arguments
from tfdist.config import invalid_argument
from tfdist.training.step.model_steps import overridden
from tfdist.training.build.placement import made_outside

logger = logging.getLogger(__name__)

#: The ``compile`` arguments the Trainer also takes, in ``compile``'s order.
COMPILE_ARGUMENTS = ("optimizer", "loss", "loss_weights", "metrics", "weighted_metrics")
DEFAULT_OPTIMIZER = "adam"


def _optimizers(model: keras.Model) -> list[keras.optimizers.Optimizer]:
    found = [getattr(model, "optimizer", None)]
    found += [v for v in vars(model).values() if isinstance(v, keras.optimizers.Optimizer)]
    return [o for i, o in enumerate(found) if o is not None and o not in found[:i]]


def _in_scope(strategy: tf.distribute.Strategy, optimizer: keras.optimizers.Optimizer) -> bool:
    counter = optimizer.iterations
    return strategy.extended.variable_created_in_scope(getattr(counter, "value", counter))


def _compiles_when_made(model: keras.Model) -> bool:
    """Whether ``model``'s class compiles it in its constructor (a ``compile`` argument of an
    ``__init__``, as KerasHub's ``Task(compile=True)``) and its ``compile`` takes Keras's
    arguments."""
    inits = [vars(c)["__init__"] for c in type(model).__mro__ if "__init__" in vars(c)]
    try:
        made = any("compile" in inspect.signature(init).parameters for init in inits)
        inspect.signature(model.compile).bind(**dict.fromkeys(COMPILE_ARGUMENTS))
    except (TypeError, ValueError):  # no signature, or not Keras's arguments
        return False
    return made


def replaces_own_compile(model: keras.Model, given: dict[str, Any]) -> bool:
    """Whether the Trainer compiles ``model`` again with ``given`` (its ``optimizer``, ``loss``,
    ..., None where not given): a model compiled by its own constructor, given arguments."""
    given_any = any(given.get(key) is not None for key in COMPILE_ARGUMENTS)
    return given_any and model.compiled and _compiles_when_made(model)


def check_own_compile(
    model: keras.Model, strategy: tf.distribute.Strategy, given: dict[str, Any] | None = None
) -> None:
    """Refuses a model whose class overrides ``compile`` unless it was compiled in the scope.

    Checked before the model is placed: placing moves variables made outside the scope into
    it, and optimizers the model's own compile built for the old ones would not follow. A
    model the Trainer compiles again (`replaces_own_compile` with ``given``) passes.
    """
    if not overridden(model, "compile") or (given and replaces_own_compile(model, given)):
        return
    name = type(model).__name__
    if not model.compiled:
        raise invalid_argument(
            "model",
            name,
            "a compiled model when its class overrides compile()",
            note=f"{name} has its own compile(), which tfdist cannot call for you. Build and "
            "compile it inside `with strategy.scope():` (or in a builder: "
            f"`Trainer(lambda: make_compiled_{name.lower()}(), strategy=...)`) and pass it.",
        )
    outside = [o.name for o in _optimizers(model) if not _in_scope(strategy, o)]
    if made_outside(strategy, model):
        recompile = (
            " Or pass its compile arguments to the Trainer (`optimizer=`, `loss=`, ...): it "
            "compiled itself when made, and the Trainer then compiles it again in the scope."
            if _compiles_when_made(model)
            else ""
        )
        raise invalid_argument(
            "model",
            name,
            "a model compiled inside the strategy's scope",
            note=f"{name} overrides compile() and its variables were made outside the scope. "
            "Build and compile it inside `with strategy.scope():`, or pass a builder that does."
            + recompile,
        )
    if outside:
        raise invalid_argument(
            "model",
            name,
            "a model compiled inside the strategy's scope",
            note=f"{name} overrides compile() and its optimizers {outside} were made outside the "
            "scope. Build and compile it inside `with strategy.scope():`, or pass a builder that "
            f"does (`Trainer(lambda: ..., strategy=...)`): tfdist cannot call {name}'s compile().",
        )


def _uncompiled(model: keras.Model, given: dict[str, Any]) -> dict[str, Any]:
    # No loss is Keras's compile(loss=None): the model's own losses (add_loss, regularisers)
    # are the objective; a model with none is refused when its first step is traced
    # (functions._no_loss_named), since only a call shows what it adds.
    args = dict(given)
    args["optimizer"] = DEFAULT_OPTIMIZER if given["optimizer"] is None else given["optimizer"]
    return args


def _check_no_conflict(model: keras.Model, given: dict[str, Any]) -> None:
    for key in COMPILE_ARGUMENTS:
        if given[key] is not None:
            raise invalid_argument(
                key,
                given[key],
                "None for a model that is already compiled",
                note=f"{type(model).__name__} was compiled already; the Trainer takes its "
                "optimizer, loss, loss_weights and metrics from that compile. Pass a compiled "
                f"model or `{key}=`, not both.",
            )


def _as_compiled(model: keras.Model, strategy: tf.distribute.Strategy, lr_active: bool) -> None:
    """Checks that a model with its own ``compile`` can be used as compiled."""
    name = type(model).__name__
    check_own_compile(model, strategy)
    if lr_active:
        raise invalid_argument(
            "lr_scaling",
            "active",
            "'none' for a model with its own compile()",
            note=f"tfdist scales the learning rate by rebuilding the optimizer, which {name}'s "
            "own compile() made. Scale its learning rates in that compile instead.",
        )


def compile_plan(
    model: keras.Model,
    placed: keras.Model,
    strategy: tf.distribute.Strategy,
    given: dict[str, Any],
    *,
    lr_active: bool,
) -> tuple[dict[str, Any] | None, int | None]:
    """The ``compile`` arguments to use for ``placed``, and a compiled ``steps_per_execution``.

    Args:
        model: The model as the user gave it (or as their builder returned it).
        placed: The model with its variables in ``strategy``'s scope.
        strategy: The Trainer's strategy.
        given: The Trainer's ``optimizer``, ``loss``, ... (None where not given).
        lr_active: Whether learning-rate scaling or warmup is on.

    Returns:
        ``(arguments, steps_per_execution)``: arguments None means "use the
        model as compiled"; ``steps_per_execution`` is the compiled one when
        it is not Keras's default 1, else None.

    Raises:
        ValueError: For a conflict between a compile and the Trainer's
            arguments, or a model that can be neither compiled nor used as is.
    """
    if not model.compiled:
        check_own_compile(model, strategy)
        return _uncompiled(model, given), None
    replaced = replaces_own_compile(model, given)
    if not replaced:
        _check_no_conflict(model, given)
    if overridden(model, "compile") and not replaced:
        _as_compiled(model, strategy, lr_active)
        return None, None
    raw = compile_arguments(model)
    if replaced:
        raw = _with_given(model, raw, given)
    if raw.get("run_eagerly"):
        raise invalid_argument(
            "model",
            f"compiled with run_eagerly={raw['run_eagerly']}",
            "a model compiled with run_eagerly=False",
            note="Distributed steps run as tf.functions; compile without run_eagerly.",
        )
    if raw.get("jit_compile"):
        logger.warning(
            "%s was compiled with jit_compile=True: tfdist's distributed step is a tf.function "
            "without XLA, so the model is not XLA-compiled.",
            type(model).__name__,
        )
    steps = raw.get("steps_per_execution")
    return {key: raw.get(key) for key in COMPILE_ARGUMENTS}, (steps if steps != 1 else None)


def _with_given(model: keras.Model, raw: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """The compile arguments of a model that compiled itself, the Trainer's given ones replacing
    its own (`replaces_own_compile`)."""
    replaced = [key for key in COMPILE_ARGUMENTS if given[key] is not None]
    kept = [key for key in COMPILE_ARGUMENTS if given[key] is None and raw.get(key) is not None]
    logger.info(
        "%s compiled itself when it was made (its constructor's `compile` argument): the "
        "Trainer compiles it again in the strategy scope with the Trainer's %s%s.",
        type(model).__name__,
        ", ".join(replaced),
        f" and its own compile's {', '.join(kept)}" if kept else "",
    )
    return {**raw, **{key: given[key] for key in replaced}}
