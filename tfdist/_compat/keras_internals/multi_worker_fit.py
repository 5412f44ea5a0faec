"""Shims that make plain Keras ``model.fit`` work on real MultiWorkerMirrored workers.

``symbolic_build``: Keras 3 ``fit``/``evaluate`` under a multi-worker strategy
call ``strategy.reduce("MEAN", batch)`` on the first distributed batch only to
learn its shapes (``TensorFlowTrainer._maybe_symbolic_build``). With two real
workers that raises "Attempt to convert a value (PerReplica...) to a Tensor".
The shim takes the first local replica's batch instead: same shapes, no collective.

``multi_worker_reduce``: after that, Keras's train step reduces each replica's
metric results with ``strategy.reduce("MEAN", v, axis=0)`` under multi-worker
collectives (``reduce_per_replica``), which fails on scalars: "Invalid reduction
dimension 0 for input with 0 dimensions". The shim reduces scalars with ``axis=None``.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfdist._compat.probing import RecordingStrategy
from tfdist._compat.shims import original

TRAINER_MODULE = "keras.src.backend.tensorflow.trainer"


def local_batch(strategy: tf.distribute.Strategy, batch: Any) -> Any:
    """Returns the first local replica's part of a distributed batch (no collective).

    Runs in cross-replica context.
    """
    return tf.nest.map_structure(
        lambda v: (
            strategy.experimental_local_results(v)[0]
            if isinstance(v, tf.distribute.DistributedValues)
            else v
        ),
        batch,
    )


def maybe_symbolic_build(self, iterator=None, data_batch=None):
    """Replaces ``TensorFlowTrainer._maybe_symbolic_build``: the first local replica's batch."""
    if self._distribute_strategy is None:
        return
    if iterator is not None:
        for _, _, it in iterator:
            data_batch = local_batch(self.distribute_strategy, next(it))
            break
    with self.distribute_strategy.scope():
        self._symbolic_build(data_batch=data_batch)


def make_reduce_per_replica(upstream):
    """Keras's ``reduce_per_replica`` (``upstream``), with scalar means fixed under multi-worker."""
    from keras.src.backend.tensorflow import trainer as tf_trainer

    def reduce_per_replica(values, strategy, reduction):
        """Keras's ``reduce_per_replica``, with scalar means fixed under multi-worker."""
        # Keras's own multi-worker test (private): only that case needs fixing.
        multi_worker = tf_trainer._collective_all_reduce_multi_worker(strategy)
        if reduction not in ("auto", "mean") or not multi_worker:
            return upstream(values, strategy, reduction)

        def reduce_one(v):
            # One replica per worker gives plain tensors, several give PerReplica.
            local = strategy.experimental_local_results(v)[0]
            if getattr(local, "shape", None) is not None and local.shape.rank == 0:
                return strategy.reduce("MEAN", v, axis=None)
            return upstream(v, strategy, reduction)

        return tf.nest.map_structure(reduce_one, values)

    return reduce_per_replica


def keras_reduces_batch_to_build(fn: Any = None) -> bool:
    """True while Keras's ``_maybe_symbolic_build`` reduces a distributed batch across replicas.

    That cross-replica ``reduce`` is what crashes with real multi-worker
    workers. Probes ``fn`` (default: the upstream function) with a two-replica
    batch and a strategy that records the calls.
    """
    # PerReplica has no public constructor; the probe needs a real distributed batch.
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer
    from tensorflow.python.distribute import values as tf_values

    fn = fn or original("symbolic_build") or TensorFlowTrainer._maybe_symbolic_build
    strategy = RecordingStrategy()
    stub = type("Stub", (), {})()
    stub._distribute_strategy = stub.distribute_strategy = strategy
    stub._symbolic_build = lambda data_batch=None: None
    batch = tf_values.PerReplica((1.0, 2.0))
    fn(stub, iterator=[(0, 0, iter([batch]))])
    return any(kind == "reduce" for kind, _ in strategy.calls)


def keras_reduces_scalars_on_axis_0(fn: Any = None) -> bool:
    """True while Keras's ``reduce_per_replica`` reduces scalars with ``axis=0`` (multi-worker)."""
    from keras.src.backend.tensorflow import trainer as tf_trainer

    fn = fn or original("multi_worker_reduce") or tf_trainer.reduce_per_replica

    class Probe(tf.distribute.MultiWorkerMirroredStrategy):
        # Never initialised: it only has to look like a multi-worker strategy.
        def __init__(self) -> None:
            self.recorder = RecordingStrategy()

        @property
        def extended(self) -> Any:
            # Keras asks the (private) multi-worker flag of the strategy's extended.
            return type(
                "Extended",
                (),
                {"_in_multi_worker_mode": lambda _: True, "worker_devices": ("cpu",)},
            )()

        def reduce(self, reduce_op: Any, value: Any, axis: Any = None) -> Any:
            return self.recorder.reduce(reduce_op, value, axis)

        def experimental_local_results(self, value: Any) -> tuple:
            return self.recorder.experimental_local_results(value)

    probe = Probe()
    scalar = type("Scalar", (), {"shape": tf.TensorShape([])})()
    fn(scalar, probe, "mean")
    return ("reduce", 0) in probe.recorder.calls
