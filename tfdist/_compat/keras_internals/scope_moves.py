"""Moving the user's live Keras objects into a strategy scope, without rebuilding them.

A variable made outside ``strategy.scope()`` cannot take part in a distributed
step. Rebuilding the object from its config (``clone_model``, ``from_config``)
loses what the config does not hold: adapted preprocessing state and lookup
tables, constructor arguments a subclass does not list, a learning-rate
schedule without ``get_config``. So tfdist keeps the objects and re-makes only
their variables' storage, in the scope, with the same values:

* `move_variables_into_scope`: in place (the user's model: the Trainer
  trains the very object the user holds).
* `copy_in_scope`: a deep copy whose variables are new ones made in the
  scope (metrics: the user's object keeps its own state).

Keras has no public way to re-make a variable's storage: a Keras variable keeps
its backend ``tf.Variable`` in the private ``_value``, set by ``_initialize``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import keras
import tensorflow as tf


def _in_scope(strategy: tf.distribute.Strategy, variable: Any) -> bool:
    # A Keras variable wraps the tf.Variable the strategy made (`.value`); only that one is known.
    return strategy.extended.variable_created_in_scope(getattr(variable, "value", variable))


def outside_scope(strategy: tf.distribute.Strategy, variables: Iterable[Any]) -> list[Any]:
    """The Keras variables among ``variables`` whose storage was made outside ``strategy``'s scope.

    Variables not created yet (a layer built later) are left out: they are made where built.
    """
    found, seen = [], set()
    for v in variables:
        if id(v) in seen or getattr(v, "_value", None) is None:
            continue
        seen.add(id(v))
        if not _in_scope(strategy, v):
            found.append(v)
    return found


def _remake(variable: Any, value: Any) -> None:
    # Keras's own `_initialize` makes the tf.Variable with the variable's trainable, aggregation
    # and synchronization: inside a scope, the strategy's kind (mirrored, on the ps tasks, ...).
    variable._initialize(value)


def move_variables_into_scope(strategy: tf.distribute.Strategy, variables: Iterable[Any]) -> int:
    """Re-makes each Keras variable's storage in ``strategy``'s scope, same value, same object.

    Every reference to the Keras variables (layers, lists, a model's weights) stays valid; only
    the backend variable behind each is new. ``tf.function``s traced before still hold the old
    ones (reset a model's ``train_function``/``test_function``/``predict_function``).

    Returns:
        How many variables were moved.
    """
    moving = outside_scope(strategy, variables)
    values = [v.numpy() for v in moving]  # read before any is replaced (tied weights)
    with strategy.scope():
        for v, value in zip(moving, values):
            _remake(v, value)
    return len(moving)


def move_variables_to_device(
    variables: Iterable[Any], device: str, strategy: tf.distribute.Strategy | None = None
) -> int:
    """Re-makes each Keras variable's storage on ``device``, same value, same object.

    For pipeline stages. Without ``strategy`` (the default one), each becomes a plain variable
    on ``device``: a strategy's scope would override the device. With a
    ``MultiWorkerMirroredStrategy`` of one replica per worker (the hybrid), each becomes a
    mirrored variable of that strategy whose one component lives on ``device``, so that the
    strategy's updates and backups treat it as any other. The optimizer's slots, made later,
    follow their variables.

    Returns:
        How many variables were moved.
    """
    moving = [v for v in variables if getattr(v, "_value", None) is not None]
    values = [v.numpy() for v in moving]  # read before any is replaced (tied weights)
    if strategy is None:
        with tf.device(device):
            for v, value in zip(moving, values):
                _remake(v, value)
        return len(moving)
    with strategy.scope(), tf.variable_creator_scope(_colocated_creator(device)):
        for v, value in zip(moving, values):
            _remake(v, value)
            _check_placed(strategy, v, device)
    return len(moving)


def _check_placed(strategy: tf.distribute.Strategy, variable: Any, device: str) -> None:
    """Fails loudly if TF's creator no longer reads ``colocate_with`` as this module expects."""
    placed = [c.device for c in strategy.experimental_local_results(variable.value)]
    want = tf.DeviceSpec.from_string(device)
    if len(placed) != 1 or tf.DeviceSpec.from_string(placed[0]).make_merged_spec(want) != (
        tf.DeviceSpec.from_string(placed[0])
    ):
        raise RuntimeError(
            f"tfdist could not make {variable.path} on {device} under "
            f"{type(strategy).__name__} (tensorflow {tf.__version__}): its components are on "
            f"{placed}. Update tfdist/_compat/keras_internals/scope_moves.py."
        )


class _OneDevice:
    """What a mirrored strategy's variable creator reads from ``colocate_with``: the devices of
    the components to make (private ``_devices``, as a distributed variable has)."""

    def __init__(self, device: str) -> None:
        self._devices = (device,)


def _colocated_creator(device: str) -> Any:
    # MirroredStrategy's creator (which MultiWorkerMirroredStrategy inherits) makes one component
    # per device of ``colocate_with._devices``; `colocate_vars_with` would check that it is one of
    # the strategy's variables, so the keyword is set directly.
    def creator(next_creator: Any, **kwargs: Any) -> Any:
        kwargs["colocate_with"] = _OneDevice(device)
        return next_creator(**kwargs)

    return creator


def copy_in_scope(strategy: tf.distribute.Strategy, obj: Any, keep: Iterable[Any] = ()) -> Any:
    """A deep copy of ``obj`` (e.g. a metric) whose Keras variables are new ones in the scope.

    Every attribute is copied as it is (constructor arguments, thresholds, functions), so the
    copy behaves as ``obj``; its variables start from ``obj``'s values.

    Args:
        strategy: Where the copy's variables are made.
        obj: A Keras object with ``variables`` (a metric).
        keep: Objects the copy shares rather than copies (e.g. the model's variables).
    """
    memo: dict[int, Any] = {id(k): k for k in keep}
    with strategy.scope():
        for v in getattr(obj, "variables", ()):
            if id(v) in memo:
                continue
            twin = _shell(v)  # every attribute (name, path, aggregation, ...) of the variable
            _remake(twin, v.numpy())
            memo[id(v)] = twin
        twin = memo[id(obj)] = _shell(obj, copy_attributes=False)
        # Attribute by attribute: Keras objects pickle (and so deep-copy) through their config,
        # which is what must not be relied on here.
        vars(twin).update(copy.deepcopy(vars(obj), memo))
        return twin


def _shell(obj: Any, *, copy_attributes: bool = True) -> Any:
    """A new object of ``obj``'s class, its constructor not run; with ``obj``'s attributes."""
    twin = object.__new__(type(obj))
    if copy_attributes:
        vars(twin).update(vars(obj))
    return twin


def live_learning_rate(optimizer: keras.optimizers.Optimizer) -> Any:
    """The optimizer's learning rate as given: a schedule or callable object, else None.

    ``optimizer.learning_rate`` gives the current value; the object itself is Keras's private
    ``_learning_rate``.
    """
    rate = getattr(optimizer, "_learning_rate", None)
    if isinstance(rate, keras.Variable) or not callable(rate):
        return None
    return rate


def optimizer_config(optimizer: keras.optimizers.Optimizer) -> dict[str, Any]:
    """``optimizer.get_config()`` with its learning-rate schedule as the live object.

    Keras serializes a schedule in ``get_config`` (a schedule without ``get_config`` raises
    NotImplementedError there): the config is read from a shallow twin whose rate is a float,
    and the live schedule put in its place, for ``from_config`` to use as is.
    """
    schedule = live_learning_rate(optimizer)
    if schedule is None:
        return optimizer.get_config()
    probe = _shell(optimizer)  # not copy.copy: Keras objects copy through their config
    vars(probe)["_learning_rate"] = 0.0  # the probe only: skips Keras's attribute tracking
    config = probe.get_config()
    config["learning_rate"] = schedule
    return config


def optimizer_copy_in_scope(
    strategy: tf.distribute.Strategy, optimizer: keras.optimizers.Optimizer
) -> keras.optimizers.Optimizer:
    """A copy of an unbuilt optimizer, every attribute kept, its variables made in the scope.

    Keras's TF optimizer keeps the strategy it was made under in the private
    ``_distribution_strategy`` (it places slots and applies updates through it): the copy
    gets ``strategy``.
    """
    made_under = getattr(optimizer, "_distribution_strategy", None)
    twin = copy_in_scope(strategy, optimizer, keep=[made_under] if made_under else [])
    if made_under is not None:
        vars(twin)["_distribution_strategy"] = strategy
    return twin
