"""Shims for Keras/TensorFlow behaviour that tfdist works around, in one place.

Each shim is gated on a **probe of the behaviour it fixes** (not on a version
number: Keras master still has the same code), is applied only where its probe
finds that behaviour, and has a test in ``tests/test_compat.py`` that fails when
upstream changes. The probes call the upstream function with small stand-ins
(a fake strategy or distribution that records what it is asked to do), so they
are cheap, need no cluster and create no tensors: ``apply`` runs at import,
before a multi-worker program creates its strategy, and TF refuses to configure
collectives once its context is initialised.

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
    its step, and restores it afterwards. If the hook is missing (a Keras that
    renamed it) with more than one replica, it raises: otherwise gradients
    would be all-reduced twice, i.e. multiplied by the replica count.

  * ``multi_worker_reduce``: after that, Keras's train step reduces each
    replica's metric results with ``strategy.reduce("MEAN", v, axis=0)`` under
    multi-worker collectives (``reduce_per_replica``), which fails on scalars:
    "Invalid reduction dimension 0 for input with 0 dimensions". The shim
    reduces scalars with ``axis=None``.

  * ``atomic_assign_add``: Keras variables implement ``assign_add`` as
    ``assign(self + value)``: a read, then a write. Under an asynchronous
    ParameterServerStrategy concurrent workers overwrite each other's
    increments (200 updates scheduled, ``optimizer.iterations`` counted 167),
    and metric totals lose updates the same way. The shim uses the TF
    variable's own ``assign_add``, one atomic op on the variable's device.

  * ``sharded_variables``: Keras 3 does not know TF's ``ShardedVariable``
    (ParameterServerStrategy with a variable partitioner). Its TF optimizer
    applies each update through ``distribution.extended.update(var, ...)``,
    which colocates with the variable and fails ("ShardedVariable doesn't
    support being used as a reference"), and ``Variable.__array__`` (used by
    ``get_weights`` and saving) calls the missing ``ShardedVariable.__array__``.
    The shim applies sharded updates directly (their ops split across the
    shards) and reads sharded values through tensor conversion.

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

#: Every shim, in the order ``apply`` considers them.
SHIMS = ("symbolic_build", "multi_worker_reduce", "atomic_assign_add", "sharded_variables")


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
    """Replacement for ``TensorFlowTrainer._maybe_symbolic_build``: the first local replica's batch, no collective."""
    if self._distribute_strategy is None:
        return
    if iterator is not None:
        for _, _, it in iterator:
            data_batch = local_batch(self.distribute_strategy, next(it))
            break
    with self.distribute_strategy.scope():
        self._symbolic_build(data_batch=data_batch)


def _make_reduce_per_replica(original):
    from keras.src.backend.tensorflow import trainer as tf_trainer

    def reduce_per_replica(values, strategy, reduction):
        """Keras's ``reduce_per_replica``, with scalar means fixed under multi-worker."""
        if reduction not in ("auto", "mean") or not tf_trainer._collective_all_reduce_multi_worker(strategy):
            return original(values, strategy, reduction)

        def reduce_one(v):
            # One replica per worker gives plain tensors, several give PerReplica.
            local = strategy.experimental_local_results(v)[0]
            if getattr(local, "shape", None) is not None and local.shape.rank == 0:
                return strategy.reduce("MEAN", v, axis=None)
            return original(v, strategy, reduction)

        return tf.nest.map_structure(reduce_one, values)

    return reduce_per_replica


def _make_atomic(original, method: str):
    from keras.src.backend.common.stateless_scope import in_stateless_scope

    def atomic(self, value):
        if in_stateless_scope():
            return original(self, value)
        value = self._convert_to_tensor(value, dtype=self.dtype)
        return getattr(self._value, method)(value)

    atomic.__name__ = method
    atomic.__doc__ = f"Keras ``Variable.{method}`` as one atomic TF op (tfdist shim)."
    return atomic


def keras_assign_add_is_read_then_write() -> bool:
    """True while Keras implements ``assign_add`` as a read followed by ``assign``."""
    import inspect

    from keras.src.backend.common.variables import Variable

    return "self.assign(self + value)" in inspect.getsource(Variable.assign_add)


def _is_sharded(variable: Any) -> bool:
    return type(variable).__name__ == "ShardedVariable"


def _make_sharded_update(original):
    def _distributed_tf_update_step(self, distribution, grads_and_vars, learning_rate):
        grads_and_vars = list(grads_and_vars)
        plain = [(g, v) for g, v in grads_and_vars if not _is_sharded(v)]
        if plain:
            original(self, distribution, plain, learning_rate)
        for grad, var in grads_and_vars:
            if _is_sharded(var):
                self.update_step(grad, var, learning_rate)

    return _distributed_tf_update_step


def _make_array(original):
    import numpy as np

    def __array__(self, dtype=None, copy=None):
        if _is_sharded(getattr(self, "_value", None)):
            return np.asarray(tf.convert_to_tensor(self._value).numpy(), dtype=dtype)
        return original(self, dtype) if dtype is not None else original(self)

    return __array__


# -- probes: does upstream still behave the way a shim works around? ------------
class _RecordingStrategy:
    """Stands in for a strategy or distribution: records reduce/update calls, does nothing."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.extended = self

    def reduce(self, reduce_op: Any, value: Any, axis: Any = None) -> Any:
        self.calls.append(("reduce", axis))
        return value

    def update(self, var: Any, fn: Any, args: Any = (), kwargs: Any = None, group: bool = True) -> None:
        self.calls.append(("update", var))

    def experimental_local_results(self, value: Any) -> tuple:
        return tuple(getattr(value, "values", (value,)))

    def scope(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


def keras_reduces_batch_to_build(fn: Any = None) -> bool:
    """True while Keras's ``_maybe_symbolic_build`` reduces a distributed batch across replicas.

    That cross-replica ``reduce`` is what crashes with real multi-worker
    workers. Probes ``fn`` (default: the upstream function) with a two-replica
    batch and a strategy that records the calls.
    """
    from tensorflow.python.distribute import values as tf_values
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    fn = fn or original("symbolic_build") or TensorFlowTrainer._maybe_symbolic_build
    strategy = _RecordingStrategy()
    stub = type("Stub", (), {})()
    stub._distribute_strategy = stub.distribute_strategy = strategy
    stub._symbolic_build = lambda data_batch=None: None
    batch = tf_values.PerReplica((1.0, 2.0))
    fn(stub, iterator=[(0, 0, iter([batch]))])
    return any(kind == "reduce" for kind, _ in strategy.calls)


def keras_reduces_scalars_on_axis_0(fn: Any = None) -> bool:
    """True while Keras's ``reduce_per_replica`` reduces a scalar metric with ``axis=0`` under multi-worker."""
    from keras.src.backend.tensorflow import trainer as tf_trainer

    fn = fn or original("multi_worker_reduce") or tf_trainer.reduce_per_replica

    class Probe(tf.distribute.MultiWorkerMirroredStrategy):
        # Never initialised: it only has to look like a multi-worker strategy.
        def __init__(self) -> None:
            self.recorder = _RecordingStrategy()

        @property
        def extended(self) -> Any:
            return type("Extended", (), {"_in_multi_worker_mode": lambda _: True, "worker_devices": ("cpu",)})()

        def reduce(self, reduce_op: Any, value: Any, axis: Any = None) -> Any:
            return self.recorder.reduce(reduce_op, value, axis)

        def experimental_local_results(self, value: Any) -> tuple:
            return self.recorder.experimental_local_results(value)

    probe = Probe()
    scalar = type("Scalar", (), {"shape": tf.TensorShape([])})()
    fn(scalar, probe, "mean")
    return ("reduce", 0) in probe.recorder.calls


def keras_updates_sharded_through_extended_update(fn: Any = None) -> bool:
    """True while Keras's TF optimizer applies a ``ShardedVariable``'s update via ``extended.update``.

    ``extended.update`` colocates with the variable, which a ShardedVariable refuses.
    """
    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    fn = fn or original("sharded_variables") or TFOptimizer._distributed_tf_update_step
    sharded = type("ShardedVariable", (), {})()  # the shim recognises it by its type's name
    optimizer = type("Optimizer", (), {"update_step": lambda self, g, v, lr: None})()
    distribution = _RecordingStrategy()
    fn(optimizer, distribution, [(1.0, sharded)], 0.1)
    return ("update", sharded) in distribution.calls


def sharded_variable_lacks_array() -> bool:
    """True while TF's ``ShardedVariable`` has no ``__array__`` (Keras's ``Variable.__array__`` calls it)."""
    from tensorflow.python.distribute.sharded_variable import ShardedVariable

    return not hasattr(ShardedVariable, "__array__")


def needs(name: str) -> bool:
    """Whether upstream still shows the behaviour that shim ``name`` works around."""
    probes = {
        "symbolic_build": keras_reduces_batch_to_build,
        "multi_worker_reduce": keras_reduces_scalars_on_axis_0,
        "atomic_assign_add": keras_assign_add_is_read_then_write,
        "sharded_variables": lambda: keras_updates_sharded_through_extended_update() or sharded_variable_lacks_array(),
    }
    return probes[name]()


_ORIGINALS: dict[str, Any] = {}


def apply() -> list[str]:
    """Applies every shim whose probe finds the behaviour it fixes. Idempotent.

    Returns:
        The names of the shims in force.
    """
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    wanted = [name for name in SHIMS if name not in _disabled() and (name in _ORIGINALS or needs(name))]
    applied = []
    if "symbolic_build" in wanted:
        if "symbolic_build" not in _ORIGINALS:
            _ORIGINALS["symbolic_build"] = TensorFlowTrainer._maybe_symbolic_build
            TensorFlowTrainer._maybe_symbolic_build = _maybe_symbolic_build
            logger.debug("Applied keras %s shim: symbolic_build", keras.__version__)
        applied.append("symbolic_build")
    if "multi_worker_reduce" in wanted:
        from keras.src.backend.tensorflow import trainer as tf_trainer

        if "multi_worker_reduce" not in _ORIGINALS:
            _ORIGINALS["multi_worker_reduce"] = tf_trainer.reduce_per_replica
            tf_trainer.reduce_per_replica = _make_reduce_per_replica(tf_trainer.reduce_per_replica)
        applied.append("multi_worker_reduce")
    if "atomic_assign_add" in wanted:
        from keras.src.backend.tensorflow.core import Variable

        if "atomic_assign_add" not in _ORIGINALS:
            _ORIGINALS["atomic_assign_add"] = (Variable.assign_add, Variable.assign_sub)
            Variable.assign_add = _make_atomic(Variable.assign_add, "assign_add")
            Variable.assign_sub = _make_atomic(Variable.assign_sub, "assign_sub")
        applied.append("atomic_assign_add")
    if "sharded_variables" in wanted:
        from keras.src.backend.tensorflow.core import Variable
        from keras.src.backend.tensorflow.optimizer import TFOptimizer

        if "sharded_variables" not in _ORIGINALS:
            _ORIGINALS["sharded_variables"] = TFOptimizer._distributed_tf_update_step
            TFOptimizer._distributed_tf_update_step = _make_sharded_update(TFOptimizer._distributed_tf_update_step)
            Variable.__array__ = _make_array(Variable.__array__)
        applied.append("sharded_variables")
    return applied


def original(name: str) -> Any:
    """Returns the upstream function a shim replaced, or None if it is not in force."""
    return _ORIGINALS.get(name)


def _identity_reduce(grads_and_vars):
    return list(grads_and_vars)


def _num_replicas(optimizer: Any) -> int:
    strategy = getattr(optimizer, "_distribution_strategy", None) or tf.distribute.get_strategy()
    return int(strategy.num_replicas_in_sync)


@contextlib.contextmanager
def gradients_already_summed(optimizer: keras.optimizers.Optimizer, *,
                             num_replicas: int | None = None) -> Iterator[None]:
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
        if not hasattr(type(opt), "_all_reduce_sum_gradients"):
            replicas = num_replicas if num_replicas is not None else _num_replicas(opt)
            if replicas > 1:
                raise RuntimeError(
                    f"tfdist cannot stop {type(opt).__name__} (keras {keras.__version__}) from all-reducing "
                    f"gradients: its private hook `_all_reduce_sum_gradients` is gone. With {replicas} replicas "
                    "the gradients tfdist already summed would be summed again (multiplied by the replica "
                    "count). Use a Keras version with the hook or update tfdist/_compat.py.")
            continue
        object.__setattr__(opt, "_all_reduce_sum_gradients", _identity_reduce)
    try:
        yield
    finally:
        for opt in targets:
            if "_all_reduce_sum_gradients" in vars(opt):
                object.__delattr__(opt, "_all_reduce_sum_gradients")


# -- ShardedVariable in user code, and the TF runtime's state ------------------
#
# ``sharded_gradients``: ``tf.GradientTape.gradient`` with a Keras variable that
# wraps a ``ShardedVariable`` among its sources (a user's own loop under
# ``min_shard_bytes``) fails with "'ShardedVariable' object has no attribute
# 'handle'": the tape asks every variable for its one resource handle. The shim
# takes the gradient of each shard instead and concatenates them along axis 0,
# as tfdist's own step does, so ``optimizer.apply_gradients`` receives one
# gradient per Keras variable.
#
# ``sharded_weight_decay``: Keras's ``_apply_weight_decay`` (AdamW, Lion, any
# ``weight_decay=``) updates each variable through
# ``distribution.extended.update``, which fails on a ShardedVariable like the
# optimizer step did. The shim decays sharded variables directly (the update is
# split across the shards).
#
# ``sharded_slots``: an optimizer built inside a ``tf.function`` (a user loop's
# first ``apply_gradients``) creates its slots under ``colocate_vars_with(var)``,
# which fails in a graph for a ShardedVariable ("doesn't support being used as
# a reference"). The shim creates such slots without colocation; the strategy's
# partitioner then shards them like the variable (same shape, same partitioner).


def sharded_variables_lack_handle() -> bool:
    """True while a ``ShardedVariable`` has no ``handle`` (so the tape cannot take it)."""
    from tensorflow.python.distribute.sharded_variable import ShardedVariable

    return not hasattr(ShardedVariable, "handle")


def keras_weight_decay_uses_extended_update() -> bool:
    """True while Keras's TF optimizer applies weight decay through ``extended.update``."""
    import inspect

    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    upstream = _ORIGINALS.get("sharded_weight_decay", TFOptimizer._apply_weight_decay)
    return "extended.update" in inspect.getsource(upstream)


def _shards_of(source: Any) -> list[Any] | None:
    inner = getattr(source, "_value", source)
    return list(inner.variables) if _is_sharded(inner) else None


def _make_sharded_gradient(original):
    def gradient(self, target, sources, *args, **kwargs):
        flat = tf.nest.flatten(sources)
        shards = [_shards_of(s) for s in flat]
        if all(s is None for s in shards):
            return original(self, target, sources, *args, **kwargs)
        expanded = [v for s, parts in zip(flat, shards) for v in (parts if parts is not None else [s])]
        grads = original(self, target, expanded, *args, **kwargs)
        out, i = [], 0
        for parts in shards:
            if parts is None:
                out.append(grads[i])
                i += 1
                continue
            pieces, i = grads[i:i + len(parts)], i + len(parts)
            out.append(None if any(p is None for p in pieces)
                       else tf.concat([tf.convert_to_tensor(p) for p in pieces], axis=0))
        return tf.nest.pack_sequence_as(sources, out)

    gradient.__doc__ = original.__doc__
    return gradient


def _make_sharded_weight_decay(original):
    def _apply_weight_decay(self, variables):
        variables = list(variables)
        plain = [v for v in variables if _shards_of(v) is None]
        if len(plain) == len(variables) or self.weight_decay is None:
            return original(self, variables)
        if plain:
            original(self, plain)
        for variable in variables:
            inner = getattr(variable, "_value", variable)
            if _is_sharded(inner) and self._use_weight_decay(variable):
                lr = tf.cast(self.learning_rate, inner.dtype)
                wd = tf.cast(self.weight_decay, inner.dtype)
                inner.assign_sub(tf.convert_to_tensor(inner) * wd * lr)

    return _apply_weight_decay


def keras_slots_colocate_with_reference() -> bool:
    """True while Keras's TF optimizer creates slot variables under ``colocate_vars_with``."""
    import inspect

    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    upstream = _ORIGINALS.get("sharded_slots", TFOptimizer.add_variable_from_reference)
    return "colocate_vars_with" in inspect.getsource(upstream)


def _make_sharded_slot(original):
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    def add_variable_from_reference(self, reference_variable, name=None, initializer="zeros"):
        if _shards_of(reference_variable) is None:
            return original(self, reference_variable, name=name, initializer=initializer)
        # What TFOptimizer's own version calls, minus the colocation.
        return BaseOptimizer.add_variable_from_reference(self, reference_variable, name=name,
                                                         initializer=initializer)

    return add_variable_from_reference


def apply_sharded_variable_shims() -> list[str]:
    """Applies the ``sharded_gradients`` and ``sharded_weight_decay`` shims where needed. Idempotent.

    ``make_strategy("parameter_server")`` calls it (with :func:`apply`), so
    partitioned variables work in users' own training loops as well as in the
    Trainer.

    Returns:
        The names of these shims in force.
    """
    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    applied = []
    if "sharded_gradients" not in _disabled() and (
            "sharded_gradients" in _ORIGINALS or sharded_variables_lack_handle()):
        if "sharded_gradients" not in _ORIGINALS:
            _ORIGINALS["sharded_gradients"] = tf.GradientTape.gradient
            tf.GradientTape.gradient = _make_sharded_gradient(tf.GradientTape.gradient)
        applied.append("sharded_gradients")
    if "sharded_weight_decay" not in _disabled() and (
            "sharded_weight_decay" in _ORIGINALS or keras_weight_decay_uses_extended_update()):
        if "sharded_weight_decay" not in _ORIGINALS:
            _ORIGINALS["sharded_weight_decay"] = TFOptimizer._apply_weight_decay
            TFOptimizer._apply_weight_decay = _make_sharded_weight_decay(TFOptimizer._apply_weight_decay)
        applied.append("sharded_weight_decay")
    if "sharded_slots" not in _disabled() and (
            "sharded_slots" in _ORIGINALS or keras_slots_colocate_with_reference()):
        if "sharded_slots" not in _ORIGINALS:
            _ORIGINALS["sharded_slots"] = TFOptimizer.add_variable_from_reference
            TFOptimizer.add_variable_from_reference = _make_sharded_slot(TFOptimizer.add_variable_from_reference)
        applied.append("sharded_slots")
    return applied


def tf_runtime_started() -> bool:
    """Whether TensorFlow's eager runtime has started in this process (devices fixed, ops may exist)."""
    from tensorflow.python.eager import context

    return context.context()._context_handle is not None


def connected_to_cluster() -> bool:
    """Whether this process's eager runtime is connected to a cluster (``connect_to_cluster``)."""
    from tensorflow.python.eager import context

    return context.get_server_def() is not None


def connected_cluster() -> dict[str, list[str]]:
    """The cluster this process is connected to, this process's own job included ({} if none)."""
    from tensorflow.python.eager import context

    server_def = context.get_server_def()
    if server_def is None:
        return {}
    return {job.name: [job.tasks[i] for i in sorted(job.tasks)] for job in server_def.cluster.job}


# -- Metric state as local tensors (consistent PS logs) ------------------------
#
# Under ParameterServerStrategy, metric variables live on the ps tasks and many
# steps update them at once: a log read while they run can be torn (a total
# that includes a step whose count is not in yet: accuracy 1.28). The PS runner
# therefore traces its scheduled function with each metric variable's TF
# variable swapped for a local tensor that starts at zero: each execution
# computes the sums of its own steps, which the coordinator adds up in order.


class _StateBox:
    """Stands in for a metric's TF variable while tracing: its value is a plain tensor."""

    def __init__(self, value: Any, dtype: Any) -> None:
        self.dtype = tf.as_dtype(dtype)
        self.current = tf.convert_to_tensor(value, dtype=self.dtype)

    @property
    def shape(self) -> tf.TensorShape:
        return self.current.shape

    def assign(self, value, **_):
        self.current = tf.convert_to_tensor(value, dtype=self.dtype)
        return self.current

    def assign_add(self, value, **_):
        return self.assign(self.current + tf.cast(value, self.dtype))

    def assign_sub(self, value, **_):
        return self.assign(self.current - tf.cast(value, self.dtype))

    def read_value(self):
        return self.current

    def value(self):
        return self.current

    def numpy(self):
        return self.current.numpy()


tf.register_tensor_conversion_function(
    _StateBox, lambda box, dtype=None, name=None, as_ref=False: tf.convert_to_tensor(box.current, dtype=dtype))


def metric_variables(model: keras.Model) -> list[Any]:
    """The model's metric state variables (loss tracker and compiled metrics)."""
    return list(model.metrics_variables)


def additive(variables: list[Any]) -> bool:
    """Whether every variable is summed across replicas, so per-execution sums can be added up."""
    return all(getattr(v, "aggregation", None) == "sum" for v in variables)


@contextlib.contextmanager
def metric_state_as_tensors(variables: list[Any], values: list[Any] | None = None) -> Iterator[list[_StateBox]]:
    """Within this block, ``variables`` (Keras metric variables) read and write local tensors.

    Args:
        variables: Keras variables, e.g. :func:`metric_variables`.
        values: Their starting values; default zeros.

    Yields:
        One box per variable; ``box.current`` is the variable's current tensor.
    """
    saved = [v._value for v in variables]
    if values is None:
        values = [tf.zeros(v.shape, v.dtype) for v in variables]
    boxes = [_StateBox(value, v.dtype) for v, value in zip(variables, values)]
    for v, box in zip(variables, boxes):
        v._value = box
    try:
        yield boxes
    finally:
        for v, value in zip(variables, saved):
            v._value = value
