"""``gradients_already_summed``: stop a Keras optimizer from all-reducing gradients.

tfdist's replica step all-reduces gradients itself (once per optimizer update,
gradient accumulation included), so the Keras optimizer must not all-reduce
them a second time. Keras exposes no switch for this; the context manager swaps
the private hook ``_all_reduce_sum_gradients`` on one optimizer instance while
tfdist traces its step, and restores it afterwards. If the hook is missing (a
Keras that renamed it) with more than one replica, it raises: otherwise
gradients would be all-reduced twice, i.e. multiplied by the replica count.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import keras
import tensorflow as tf

HOOK = "_all_reduce_sum_gradients"


def _identity_reduce(grads_and_vars):
    return list(grads_and_vars)


def _num_replicas(optimizer: Any) -> int:
    # The strategy Keras stored on the optimizer when it was created in a scope (private).
    strategy = getattr(optimizer, "_distribution_strategy", None) or tf.distribute.get_strategy()
    return int(strategy.num_replicas_in_sync)


@contextlib.contextmanager
def gradients_already_summed(
    optimizer: keras.optimizers.Optimizer, *, num_replicas: int | None = None
) -> Iterator[None]:
    """Within this block, ``optimizer`` applies gradients without all-reducing them.

    Only tracing reads the hook, so wrap every call of a ``tf.function`` that
    may (re)trace an ``optimizer.apply``. Works for a ``LossScaleOptimizer`` too.

    Args:
        optimizer: The Keras optimizer (created in the strategy scope).
        num_replicas: Replicas in sync; default the optimizer's strategy's.

    Raises:
        RuntimeError: If Keras no longer has the private hook and there is more
            than one replica: the optimizer would all-reduce the already summed
            gradients again, multiplying them by the replica count.
    """
    targets = [optimizer]
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is not None:
        targets.append(inner)
    for opt in targets:
        if not hasattr(type(opt), HOOK):
            replicas = num_replicas if num_replicas is not None else _num_replicas(opt)
            if replicas > 1:
                raise RuntimeError(
                    f"tfdist cannot stop {type(opt).__name__} (keras {keras.__version__}) from "
                    f"all-reducing gradients: its private hook `{HOOK}` is gone. With {replicas} "
                    "replicas the gradients tfdist already summed would be summed again "
                    "(multiplied by the replica count). Use a Keras version with the hook or "
                    "update tfdist/_compat/keras_internals/optimizer.py."
                )
            continue
        # An instance attribute shadows the class's method for this optimizer only;
        # object.__setattr__ skips Keras's attribute tracking.
        object.__setattr__(opt, HOOK, _identity_reduce)
    try:
        yield
    finally:
        for opt in targets:
            if HOOK in vars(opt):
                object.__delattr__(opt, HOOK)


@contextlib.contextmanager
def updates_on_variable_devices(optimizer: keras.optimizers.Optimizer) -> Iterator[None]:
    """Within this block (while tracing), each variable's update runs on that variable's device.

    Under TF's default strategy Keras's optimizer runs every variable's ``update_step`` on the
    current device, so a pipeline stage's variables and slots would be read to, and written
    from, the first stage's device (another process's, with ``stage_tasks``). A strategy's own
    ``extended.update`` places them; the default strategy's does not. The public per-variable
    ``update_step`` is wrapped on this optimizer (and a loss-scale optimizer's inner one) only.
    """
    targets = [optimizer]
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is not None:
        targets.append(inner)
    for opt in targets:
        original = opt.update_step

        def on_device(gradient: Any, variable: Any, learning_rate: Any, _step: Any = original):
            device = getattr(variable, "device", None) or getattr(variable.value, "device", None)
            with tf.device(device):
                return _step(gradient, variable, learning_rate)

        object.__setattr__(opt, "update_step", on_device)  # skips Keras's attribute tracking
    try:
        yield
    finally:
        for opt in targets:
            if "update_step" in vars(opt):
                object.__delattr__(opt, "update_step")


def apply_in_cross_replica_context(
    optimizer: keras.optimizers.Optimizer, grads: list[Any], variables: list[Any]
) -> None:
    """``optimizer.apply(grads, variables)`` from cross-replica context (local SGD's outer step).

    Keras's TF optimizer reaches its update through the private
    ``tf.__internal__.distribute.interim.maybe_merge_call``, which asks the replica context for a
    ``merge_call`` and finds none in cross-replica context; while this applies, a call from
    cross-replica context runs its function directly (what a ``merge_call`` would have run).
    """
    interim = tf.__internal__.distribute.interim
    original = interim.maybe_merge_call

    def direct(fn, strategy, *args, **kwargs):
        if tf.distribute.in_cross_replica_context():
            return fn(strategy, *args, **kwargs)
        return original(fn, strategy, *args, **kwargs)

    interim.maybe_merge_call = direct
    try:
        optimizer.apply(grads, variables)
    finally:
        interim.maybe_merge_call = original
