"""Each worker's share of every global batch, set alike on every worker (``Trainer(balance=)``).

MultiWorkerMirrored gives each replica ``global_batch_size / replicas`` examples of every
global batch. With a balanced split (`tfdist.training.balance.balancer` decides it) every worker
reads the **whole** global batch, the same examples in the same order, and its replicas train on
their slices of it: replica ``r`` takes examples ``[sum(shares[:r]), sum(shares[:r + 1]))``.
The shares are one int32 variable per process that every worker assigns the same values
between calls, so a new split changes no shape in the graph and retraces nothing.

The replica step needs nothing more to stay exact: it weighs each replica's loss by its
own example count over the global one (`tfdist.training.step.update`), so any split sums to the
same gradient (up to the order of the float sums). A global batch shorter than the
shares (a last partial batch of arrays) is cut at its end: the last replicas get fewer
examples, or none, and every example is still trained on exactly once.

At the even split this costs what the even run does (issue 45, measured by fits alternated in
one launch: docs/benchmarks.md): on one CPU replica the whole batches come through the even
run's plain iterator (`SyncRunner.distribute`), the slice is cheap (a view of the batch
where its start is aligned, else a copy of the share), and the even run's batches of tfdist's
in-memory datasets are of unknown size too. What it does cost: an input pipeline that shards
before a heavy per-example ``map`` does that work for every example of the global batch on
every worker.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tfdist.data.inputs import InputSource
from tfdist.strategies import step_clock
from tfdist.strategies.base import graph_function

#: What one input pipeline of a balanced run is: the whole input, as one pipeline of one replica.
WHOLE = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0)


def _each_local_replica(dataset: tf.data.Dataset, local_replicas: int) -> tf.data.Dataset:
    """Every element ``local_replicas`` times in a row: each local replica gets every global
    batch (a worker's pipeline hands its replicas successive elements)."""
    if local_replicas == 1:
        return dataset
    return dataset.flat_map(
        lambda *e: tf.data.Dataset.from_tensors(e if len(e) > 1 else e[0]).repeat(local_replicas)
    )


class BalancedSplit:
    """The shares of one synchronous multi-worker runner, its whole-batch input and its clock.

    Args:
        strategy: The ``MultiWorkerMirroredStrategy``.
        workers: Processes in sync (each with ``local_replicas`` replicas).
        local_replicas: Replicas per process.

    Attributes:
        clock: This worker's per-update sections since the balancer last read them.
        shares: Examples per worker of every global batch, as last set.
    """

    def __init__(self, strategy: tf.distribute.Strategy, workers: int, local_replicas: int):
        self.strategy = strategy
        self.workers = workers
        self.local_replicas = local_replicas
        self.clock = step_clock.StepClock()
        self.clock.enabled = True
        self.shares: list[int] = []
        with tf.init_scope():  # a plain variable of this process, not a mirrored one
            self._variable = tf.Variable(
                tf.zeros([workers * local_replicas], tf.int32), trainable=False, name="shares"
            )
        self._gather: Any = None

    def set(self, shares: Sequence[int]) -> None:
        """Examples per worker of every global batch from the next call on; each a multiple of
        ``local_replicas`` (split evenly over them). Every worker must set the same."""
        self.shares = [int(s) for s in shares]
        per_replica = [s // self.local_replicas for s in self.shares]
        self._variable.assign(np.repeat(per_replica, self.local_replicas).astype(np.int32))

    def take(self, batch: Any) -> Any:
        """This replica's slice of a whole global ``batch`` (replica context)."""
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        shares = tf.convert_to_tensor(self._variable)
        end = tf.cumsum(shares)[replica]
        start = end - shares[replica]
        size = tf.shape(next(t for t in tf.nest.flatten(batch) if t is not None))[0]
        start, end = tf.minimum(start, size), tf.minimum(end, size)
        return tf.nest.map_structure(lambda t: None if t is None else t[start:end], batch)

    def sliced(self, replica_fn: Callable[[Sequence[Any]], Any]) -> Callable[..., Any]:
        """``replica_fn`` on this replica's slices of its whole micro-batches."""

        def on_slices(batches: Sequence[Any]) -> Any:
            return replica_fn([self.take(batch) for batch in batches])

        return on_slices

    def distribute(self, source: InputSource) -> Any:
        """The training source as whole global batches on every worker and replica."""
        local = self.local_replicas
        if source.dataset_fn is not None:
            fn = source.dataset_fn
            return self.strategy.distribute_datasets_from_function(
                lambda _: _each_local_replica(fn(WHOLE), local)
            )
        dataset = source.dataset
        return self.strategy.distribute_datasets_from_function(
            lambda _: _each_local_replica(dataset, local)
        )

    def gather(self, row: Sequence[float]) -> np.ndarray:
        """Every worker's ``row`` (float64, the same length on each), in worker order: one
        all-reduce, into which only each worker's first replica puts its row."""
        if self._gather is None:
            strategy, local, workers = self.strategy, self.local_replicas, self.workers

            def send(value):
                def replica():
                    rid = tf.distribute.get_replica_context().replica_id_in_sync_group
                    first = tf.cast(tf.equal(rid % local, 0), tf.float64)
                    mine = tf.one_hot(rid // local, workers, dtype=tf.float64)
                    return tf.reshape(mine[:, None] * value[None, :], [-1]) * first

                sent = strategy.run(replica)
                return strategy.reduce(tf.distribute.ReduceOp.SUM, sent, axis=None)

            self._gather = graph_function(send)
        values = np.asarray(row, np.float64)
        summed = self._gather(tf.constant(values)).numpy()
        return summed.reshape(self.workers, len(values))
