"""Shims for Keras/TensorFlow behaviour that tfdist works around, in one place.

Each shim names the upstream version range it is for, is applied only there, and
has a test in ``tests/test_compat.py`` that fails when upstream changes.

Shims:
  * ``symbolic_build``: Keras 3 ``fit``/``evaluate`` under a multi-worker
    strategy call ``strategy.reduce("MEAN", batch)`` on the first distributed
    batch only to learn its shapes (``TensorFlowTrainer._maybe_symbolic_build``).
    With two real MultiWorkerMirroredStrategy workers that raises
    "Attempt to convert a value (PerReplica...) to a Tensor". The shim takes the
    first local replica's batch instead: same shapes, no collective.
  * ``gradients_already_summed``: tfdist's replica step all-reduces gradients
    itself (once per optimizer update, gradient accumulation included), so the
    Keras optimizer must not all-reduce them a second time. Keras exposes no
    switch for this; the context manager swaps the private hook
    ``_all_reduce_sum_gradients`` on one optimizer instance while tfdist traces
    its step, and restores it afterwards.

Set ``TFDIST_DISABLE_COMPAT=symbolic_build`` (comma separated) to skip a shim,
e.g. to check whether upstream still needs it.
"""
from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Iterator

import keras
import tensorflow as tf

logger = logging.getLogger(__name__)

KERAS_VERSION = tuple(int(p) for p in keras.__version__.split(".")[:2])
# The multi-worker `_maybe_symbolic_build` crash: seen on 3.15.1, not fixed upstream yet.
SYMBOLIC_BUILD_AFFECTED = (3, 0) <= KERAS_VERSION < (3, 16)


def _disabled() -> set[str]:
    return {s.strip() for s in os.environ.get("TFDIST_DISABLE_COMPAT", "").split(",") if s.strip()}


def local_batch(strategy: tf.distribute.Strategy, batch: Any) -> Any:
    """Returns the first local replica's part of a distributed batch (no collective).

    Runs in cross-replica context.
    """
    return tf.nest.map_structure(
        lambda v: strategy.experimental_local_results(v)[0]
        if isinstance(v, tf.distribute.DistributedValues)
        else v,
        batch,
    )


def _maybe_symbolic_build(self, iterator=None, data_batch=None):
    """Replacement for ``TensorFlowTrainer._maybe_symbolic_build`` (keras < 3.16)."""
    if self._distribute_strategy is None:
        return
    if iterator is not None:
        for _, _, it in iterator:
            data_batch = local_batch(self.distribute_strategy, next(it))
            break
    with self.distribute_strategy.scope():
        self._symbolic_build(data_batch=data_batch)


_ORIGINALS: dict[str, Any] = {}


def apply() -> list[str]:
    """Applies every shim that this Keras version needs. Idempotent.

    Returns:
        The names of the shims in force.
    """
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    applied = []
    if SYMBOLIC_BUILD_AFFECTED and "symbolic_build" not in _disabled():
        if "symbolic_build" not in _ORIGINALS:
            _ORIGINALS["symbolic_build"] = TensorFlowTrainer._maybe_symbolic_build
            TensorFlowTrainer._maybe_symbolic_build = _maybe_symbolic_build
            logger.debug("Applied keras %s shim: symbolic_build", keras.__version__)
        applied.append("symbolic_build")
    return applied


def original(name: str) -> Any:
    """Returns the upstream function a shim replaced (for tests)."""
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    return _ORIGINALS.get(name, TensorFlowTrainer._maybe_symbolic_build)


def _identity_reduce(grads_and_vars):
    return list(grads_and_vars)


@contextlib.contextmanager
def gradients_already_summed(optimizer: keras.optimizers.Optimizer) -> Iterator[None]:
    """Within this block, ``optimizer`` applies gradients without all-reducing them.

    Only tracing reads the hook, so wrap every call of a ``tf.function`` that
    may (re)trace an ``optimizer.apply``. Works for a ``LossScaleOptimizer`` too.
    """
    targets = [optimizer]
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is not None:
        targets.append(inner)
    for opt in targets:
        if not hasattr(type(opt), "_all_reduce_sum_gradients"):
            continue
        object.__setattr__(opt, "_all_reduce_sum_gradients", _identity_reduce)
    try:
        yield
    finally:
        for opt in targets:
            if "_all_reduce_sum_gradients" in vars(opt):
                object.__delattr__(opt, "_all_reduce_sum_gradients")
