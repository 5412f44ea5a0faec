"""The runner for synchronous strategies: one_device, mirrored and multi_worker.

One ``tf.function`` loops over calls of the replica step with ``strategy.run``;
the Python loop above it sees one call per execution.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tfdist._compat.keras_internals.metric_state import (
    additive,
    metric_state_as_tensors,
    metric_variables,
)
from tfdist._compat.tf_internals.inputs import one_cpu_replica, plain_iterator
from tfdist.cluster import task_label
from tfdist.data.inputs import InputSource
from tfdist.logs import as_floats
from tfdist.strategies import step_clock
from tfdist.strategies.balanced_split import BalancedSplit
from tfdist.strategies.base import (
    CrossReplicaFn,
    LogsFn,
    LoopOptions,
    ReplicaFn,
    graph_function,
    repeat,
)
from tfdist.strategies.base import until_exhausted as until_exhausted_loop

#: The key under which a timed train loop returns its clock vector beside the logs.
CLOCK_KEY = "_tfdist_step_clock"
#: Flags per stop vote (`SyncRunner.agree_each`): fewer are padded, so one trace serves all.
_VOTE_WIDTH = 4


def _timed_call(
    strategy: tf.distribute.Strategy, replica_fn: ReplicaFn, iterator: Any, batches_per_call: int
) -> tuple[Any, tf.Tensor]:
    """One replica call with its input, compute and exchange times (see ``step_clock``)."""
    started = tf.timestamp()
    with tf.control_dependencies([started]):
        batches = [next(iterator) for _ in range(batches_per_call)]
    ready = step_clock.timestamp_after(batches)

    def replica(batches):
        with step_clock.recording() as marks:
            out = replica_fn(batches)
        return out, step_clock.replica_marks(marks)

    out, marks = strategy.run(replica, args=(batches,))
    local = strategy.experimental_local_results(marks)
    compute_and_exchange = step_clock.call_clock(started, ready, local)
    return out, compute_and_exchange


def _sharded_by_data(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """A dataset of global batches, split over the workers by DATA unless it chose a policy.

    Under tf.data's default AUTO policy a dataset read from files is sharded by FILE: each
    worker reads its own files, so a step's batches are not the global batches the dataset
    yields (the ones Keras's ``fit`` trains on). DATA gives each worker its share of every
    global batch, in order, also for a batch that does not divide by the replicas. An explicit
    policy (FILE, HINT, OFF) is the user's choice and is kept; so is a ``dataset_fn``'s own
    sharding. One worker (one_device, mirrored) shards nothing either way.
    """
    policy = tf.data.experimental.AutoShardPolicy
    if dataset.options().experimental_distribute.auto_shard_policy != policy.AUTO:
        return dataset
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = policy.DATA
    return dataset.with_options(options)


class SyncRunner:
    """Runs replica steps synchronously with ``strategy.run``.

    Args:
        strategy: A synchronous ``tf.distribute.Strategy``.
    """

    def __init__(self, strategy: tf.distribute.Strategy) -> None:
        self.strategy = strategy
        resolver = getattr(strategy, "cluster_resolver", None)
        self._task_type = getattr(resolver, "task_type", None) or "worker"
        self._task_id = int(getattr(resolver, "task_id", None) or 0)
        extended = strategy.extended
        self._is_chief = bool(getattr(extended, "should_checkpoint", True))
        self._vote = None
        self._alone: bool | None = None  # one input pipeline: nothing to vote with
        self._broadcast = None
        # id(evaluation source) -> its distributed dataset, while the source lives.
        self._evaluation_inputs: dict[int, Any] = {}
        #: Per-update sections on this worker (enabled by the straggler report).
        self.step_clock = step_clock.StepClock()
        #: Each worker's share of every global batch, once a balancing runner's
        #: ``enable_balance`` made it (`tfdist.strategies.multi_worker.MultiWorkerRunner`).
        self.balanced: BalancedSplit | None = None
        self._started = 0.0

    @property
    def is_chief(self) -> bool:
        return self._is_chief

    @property
    def task_label(self) -> str:
        return task_label(self._task_type, self._task_id)

    @property
    def loop_tasks(self) -> list[str]:
        spec = getattr(self.strategy, "cluster_resolver", None)
        jobs = spec.cluster_spec().as_dict() if spec is not None else {}
        labels = [
            task_label(job, i) for job in ("chief", "worker") for i in range(len(jobs.get(job, [])))
        ]
        return labels or [self.task_label]

    def input_context(self) -> tf.distribute.InputContext:
        spec = getattr(
            getattr(self.strategy, "cluster_resolver", None), "cluster_spec", lambda: None
        )()
        jobs = spec.as_dict() if spec is not None else {}
        chiefs = len(jobs.get("chief", []))
        num_pipelines = max(chiefs + len(jobs.get("worker", [])), 1)
        pipeline_id = 0 if self._task_type == "chief" else self._task_id + chiefs
        if not jobs:
            pipeline_id = 0
        return tf.distribute.InputContext(
            num_input_pipelines=num_pipelines,
            input_pipeline_id=pipeline_id,
            num_replicas_in_sync=self.strategy.num_replicas_in_sync,
        )

    max_in_flight = 0  # logs are fetched right after each call
    #: What ``Trainer(steps_per_execution="auto")`` runs per call when no callback needs every
    #: batch: enough that the per-call logs, metric reductions and preemption vote cost little.
    auto_steps_per_execution = 32
    requires_steps_per_epoch = False
    reads_training_input_here = True  # every worker reads its own copy of the batches
    #: ``LoopOptions(outputs=True)`` hands ``logs_fn`` the last call's outputs, averaged over
    #: the replicas (as Keras's fit reduces a train_step's logs under tf.distribute).
    reduces_step_outputs = True
    #: Local SGD runs on every sync strategy: each replica's component of a mirrored variable
    #: is its copy (one replica: plain training, every sync the identity).
    local_sgd_refusal = None

    @property
    def sharding_refusal(self) -> str | None:
        """Why ``ExchangeOptions(sharding=...)`` cannot run here, or None (mirrored, MWMS)."""
        kinds = (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy)
        if isinstance(self.strategy, kinds):
            return None
        return (
            f"{type(self.strategy).__name__} has one replica: there is nothing to shard the "
            "optimizer state over. Use a mirrored or multi_worker strategy, or no sharding."
        )

    @property
    def balance_refusal(self) -> str | None:
        """Why ``Trainer(balance=...)`` cannot run here: only ``MultiWorkerRunner`` balances."""
        return (
            f"{type(self.strategy).__name__} runs every replica in this one process, whose "
            "clock cannot tell one replica's speed from another's: balance splits the global "
            "batch between the workers of a multi_worker strategy."
        )

    def distribute(self, source: InputSource, *, training: bool = True) -> Any:
        if training:
            return self._distribute(source, training=True)
        # One distributed dataset per evaluation source, each pass a fresh iterator over it, as
        # Keras's fit keeps its validation's: a fit validates on the same source every epoch,
        # and building it again (its tf.data graph, on every worker) cost 20-40 ms an epoch.
        key = id(source)
        if key not in self._evaluation_inputs:
            self._evaluation_inputs[key] = self._distribute(source, training=False)
            weakref.finalize(source, self._evaluation_inputs.pop, key, None)
        return self._evaluation_inputs[key]

    def _distribute(self, source: InputSource, *, training: bool) -> Any:
        if training and source.exact and source.dataset_fn is not None:
            # TF syncs every multi-worker get_next of a finite input with an all-reduce of
            # "has data" (in case one pipeline ran dry), so a worker's input wait would hold
            # the others'. An exact source cannot run dry, and the loop takes exactly an epoch's
            # steps: an endless stream drops that all-reduce, and each worker's wait is its own.
            source = source.repeated()
        if training and self.balanced is not None:
            # Every worker reads whole global batches; a plain iterator too (issue 45: TF's
            # multi-device one cost the digits CNN twice the CPU per update).
            distributed = self.balanced.distribute(source)
        elif source.dataset_fn is not None:
            distributed = self.strategy.distribute_datasets_from_function(source.dataset_fn)
        else:
            return self.strategy.experimental_distribute_dataset(_sharded_by_data(source.dataset))
        # One CPU replica here: a plain iterator, not TF's multi-device one (0.17 s each).
        return plain_iterator(distributed) if one_cpu_replica(self.strategy) else distributed

    def make_iterator(self, distributed: Any) -> Any:
        return iter(distributed)

    def _is_alone(self) -> bool:
        """One input pipeline (one process): nothing to vote or broadcast with. Asked once: the
        cluster does not change under a strategy."""
        if self._alone is None:
            self._alone = self.input_context().num_input_pipelines == 1
        return self._alone

    def agree(self, flag: bool) -> bool:
        return self.agree_each([flag])[0]

    def agree_each(self, flags: Sequence[bool]) -> tuple[bool, ...]:
        if self._is_alone():
            return tuple(bool(f) for f in flags)
        # Every worker must stop at the same step: any worker's flag stops all. One vector of
        # flags, one all-reduce; padded to a fixed width so that one trace serves every count.
        if self._vote is None:
            strategy = self.strategy

            @graph_function
            def vote(values):
                votes = strategy.run(lambda: tf.identity(values))
                return strategy.reduce(tf.distribute.ReduceOp.SUM, votes, axis=None)

            self._vote = vote
        values = [1.0 if f else 0.0 for f in flags]
        values += [0.0] * (max(_VOTE_WIDTH - len(values), 0))
        summed = self._vote(tf.constant(values)).numpy()
        return tuple(bool(v > 0) for v in summed[: len(flags)])

    def broadcast(self, values: Sequence[int]) -> list[int]:
        if self._is_alone():
            return list(values)
        # A sum in which only the chief's replicas put in the values; every
        # worker has the same number of local replicas, so dividing by it
        # gives the chief's values back exactly.
        if self._broadcast is None:
            strategy = self.strategy

            @graph_function
            def send(value):
                sent = strategy.run(lambda: tf.identity(value))
                return strategy.reduce(tf.distribute.ReduceOp.SUM, sent, axis=None)

            self._broadcast = send
        mine = [int(v) for v in values] if self.is_chief else [0] * len(values)
        local_replicas = len(self.strategy.extended.worker_devices)
        return [
            int(v) // local_replicas for v in self._broadcast(tf.constant(mine, tf.int64)).numpy()
        ]

    def compile_loop(
        self,
        replica_fn: ReplicaFn,
        logs_fn: LogsFn,
        loop: LoopOptions,
        *,
        model: Any = None,
        cross_replica: CrossReplicaFn | None = None,
    ) -> Callable[[Any, Any], Any]:
        strategy, name = self.strategy, loop.name
        if loop.until_exhausted:  # one batch per call (see the protocol)
            return until_exhausted_loop(
                lambda batch: strategy.run(replica_fn, args=([batch],)), logs_fn, name
            )
        batches_per_call, training, outputs = loop.batches_per_call, loop.training, loop.outputs
        drive = cross_replica
        if training and self.balanced is not None:  # each replica on its share, timed
            replica_fn, drive = self.balanced.sliced(replica_fn), None
        # Micro-batches accumulated in the step's own symbolic loop are not timed.
        clocked = self.step_clock.enabled or (
            self.balanced is not None and self.balanced.clock.enabled
        )
        timed = training and clocked and (drive is None or batches_per_call == 1)

        def call(iterator):
            """One replica call: (its outputs, its clock vector or None)."""
            if not timed:
                batches = [next(iterator) for _ in range(batches_per_call)]
                return strategy.run(replica_fn, args=(batches,)), None
            return _timed_call(strategy, replica_fn, iterator, batches_per_call)

        def run_calls(iterator, num_calls):
            def one_call(clock):
                if drive is not None and not timed and not outputs:
                    # The step loops over its micro-batches itself (symbolically, see step.py).
                    drive(lambda fn, args: strategy.run(fn, args=args), lambda: next(iterator))
                    return clock
                _, vector = call(iterator)
                return clock + vector if timed else clock

            clock = tf.zeros([len(step_clock.FIELDS) - 1], tf.float64)
            if not outputs:
                clock = repeat(num_calls, one_call, clock)
                logs = logs_fn()
                return {**logs, CLOCK_KEY: clock} if timed else logs
            # The last call's outputs are the logs: it runs after the loop, unrolled.
            clock = repeat(num_calls - 1, one_call, clock)
            last, vector = call(iterator)
            clock = clock + vector if timed else clock
            mean = tf.distribute.ReduceOp.MEAN
            logs = logs_fn(tf.nest.map_structure(lambda v: strategy.reduce(mean, v, None), last))
            return {**logs, CLOCK_KEY: clock} if timed else logs

        run_calls.__name__ = name
        return graph_function(run_calls)

    def metrics_result(self, model: Any) -> dict[str, tf.Tensor]:
        """``model.get_metrics_result()`` with all metric state reduced in ONE all-reduce.

        Runs in cross-replica context inside a ``tf.function``. Reading each
        replica-local metric variable in cross-replica context is one
        cross-worker reduction per variable (loss total and count, each
        metric's total and count, ...); packing them all into one vector makes
        it one collective. The sums are the same ones, so the logs stay exact.
        Metrics whose state is not a float32 sum are read the usual way.
        """
        variables = metric_variables(model)
        if (
            self.strategy.num_replicas_in_sync == 1
            or not variables
            or not additive(variables)
            or any(tf.as_dtype(v.dtype) != tf.float32 for v in variables)
        ):
            return model.get_metrics_result()

        def local_sums():
            # In replica context a replica-local variable reads its own (local) value.
            packed = tf.concat(
                [tf.reshape(tf.convert_to_tensor(v.value), [-1]) for v in variables], axis=0
            )
            return tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, packed
            )

        summed = self.strategy.experimental_local_results(self.strategy.run(local_sums))[0]
        sizes = [int(np.prod(v.shape)) for v in variables]
        values = [tf.reshape(t, v.shape) for t, v in zip(tf.split(summed, sizes), variables)]
        with metric_state_as_tensors(variables, values):
            return dict(model.get_metrics_result())

    def reset_metrics(self, model: Any) -> None:
        """``model.reset_metrics()`` with no collective (`MetricResettingRunner`).

        Keras resets in cross-replica context, where assigning a replica-local variable reads it
        back: an eager all-reduce per variable on multi_worker (about 20 ms of CPU and a wait for
        the other workers for a loss and an accuracy; about 11 ms on one worker's digits epoch, as
        a collective of one), at every epoch and evaluation. Here the
        metrics' own ``reset_state`` writes local tensors, and each value goes to every replica's
        copy as TF's cross-replica assignment spreads it (a summed variable's divided by the
        replica count): the same state, eagerly, with nothing read back.
        """
        variables = metric_variables(model)
        n = self.strategy.num_replicas_in_sync
        distributed = all(isinstance(v.value, tf.distribute.DistributedValues) for v in variables)
        if not variables or not distributed:
            model.reset_metrics()
            return
        with metric_state_as_tensors(variables) as boxes:
            model.reset_metrics()
        for v, box in zip(variables, boxes):
            value = box.current
            if v.aggregation == "sum":
                value = tf.cast(value / n, value.dtype)
            for copy in self.strategy.experimental_local_results(v.value):
                copy.assign(value, read_value=False)

    def compile_predict(
        self, replica_fn: ReplicaFn, *, name: str = "predict_function"
    ) -> Callable[[Any], Any]:
        strategy = self.strategy

        def predict(batch):
            outputs = strategy.run(replica_fn, args=(batch,))
            # Each replica holds the next slice of the global batch, so
            # concatenating in replica order (across workers too) keeps the input order.
            return tf.nest.map_structure(lambda v: strategy.gather(v, axis=0), outputs)

        predict.__name__ = name
        return graph_function(predict)

    def run(self, fn: Callable[[Any, Any], Any], iterator: Any, num_calls: int) -> Any:
        self._started = time.perf_counter()
        return fn(iterator, tf.constant(num_calls, tf.int32))

    def fetch(self, logs: Any) -> dict[str, float]:
        if CLOCK_KEY in logs:
            logs = dict(logs)
            sections = logs.pop(CLOCK_KEY).numpy()
            # Calls run one at a time (max_in_flight=0): start to fetch is the call's wall time.
            vector = [*sections, time.perf_counter() - self._started]
            if self.step_clock.enabled:
                self.step_clock.add(vector)
            if self.balanced is not None:
                self.balanced.clock.add(vector)
        return as_floats(logs)

    def join(self) -> None:
        return None

    def expect_batch_logs(self, read: bool) -> None:
        pass  # each call's logs come with it, read or not

    def final_logs(self, logs_fn: LogsFn, last: dict[str, float]) -> dict[str, float]:
        return last  # the last call saw every step
