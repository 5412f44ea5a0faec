"""The runner for ``ParameterServerStrategy``: schedule, fetch, join.

Training steps are ``tf.function`` calls scheduled on any free worker with
``ClusterCoordinator.schedule``; each returns its logs as a ``RemoteValue``.
Up to ``max_in_flight`` calls run ahead of the logs the loop has fetched, so
workers stay busy while callbacks still receive real values, in order.

Evaluation runs on the coordinator itself, reading the variables from the ps
tasks: each validation example is counted exactly once.
"""
from __future__ import annotations

import contextlib
import logging
import re
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from tfdist.data.inputs import InputSource
from tfdist.strategies.base import LogsFn, ReplicaFn

logger = logging.getLogger(__name__)

_TASK_RE = re.compile(r"/job:(ps|worker|chief)/replica:\d+/task:(\d+)")

#: A scheduled training call runs up to this many steps unrolled (a Python loop,
#: one trace per count), more in a ``tf.range`` loop. A ``tf.while_loop`` around
#: steps that read and update variables on the ps tasks is partitioned into a
#: loop spread over worker and ps, with extra cross-task sends and receives and
#: executor work on every call: about 5 ms of CPU per call plus 1 ms per step
#: on the in-process bench cluster, some 15% of a small CNN's step.
MAX_UNROLLED_STEPS = 16


def _coordinator(strategy: tf.distribute.Strategy) -> Any:
    # One coordinator per strategy: TF refuses a second one.
    coordinator = getattr(strategy, "_tfdist_coordinator", None)
    if coordinator is None:
        coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
        strategy._tfdist_coordinator = coordinator
    return coordinator


class ParameterServerFailure(RuntimeError):
    """A parameter server failed; training cannot go on without its variables."""


def _raise_clearly(error: Exception) -> None:
    text = str(error)
    match = _TASK_RE.search(text)
    if (match and match.group(1) == "ps") or "ps" in type(error).__name__.lower():
        task = f"ps:{match.group(2)}" if match else "a ps task"
        raise ParameterServerFailure(
            f"Parameter server {task} failed, so training stopped (the variables live there). "
            f"Restart the job; with backup_dir set it resumes from the last backup. Cause: "
            f"{type(error).__name__}: {text.splitlines()[0] if text else ''}") from error
    raise error


class PSRunner:
    """Runs replica steps on a ParameterServerStrategy through a ClusterCoordinator."""

    def __init__(self, strategy: tf.distribute.Strategy) -> None:
        self.strategy = strategy
        self.coordinator = _coordinator(strategy)
        self.num_workers = strategy.extended._num_workers
        self.max_in_flight = 2 * self.num_workers

    #: Workers repeat their datasets independently, so an epoch has no natural end.
    requires_steps_per_epoch = True

    @property
    def is_chief(self) -> bool:
        return True  # the coordinator is the only process that runs the loop

    @property
    def task_label(self) -> str:
        return "chief:0"

    def input_context(self) -> tf.distribute.InputContext:
        # What ParameterServerStrategy gives every worker's dataset_fn.
        return tf.distribute.InputContext(1, 0, self.strategy.num_replicas_in_sync)

    def distribute(self, source: InputSource, *, training: bool = True) -> Any:
        if not training:
            return source.dataset_fn(self.input_context()) if source.dataset_fn else source.dataset
        strategy = self.strategy
        # Workers draw batches independently, so each pipeline repeats.
        if source.dataset_fn is None:
            # A dataset made here is serialised with its graph and rebuilt on
            # every worker: each worker reads all of it, as a dataset_fn does.
            return self.coordinator.create_per_worker_dataset(
                strategy.experimental_distribute_dataset(source.dataset.repeat()))
        dataset_fn = source.dataset_fn

        def per_worker_dataset():
            return strategy.distribute_datasets_from_function(lambda ctx: dataset_fn(ctx).repeat())

        return self.coordinator.create_per_worker_dataset(per_worker_dataset)

    def make_iterator(self, distributed: Any) -> Any:
        return iter(distributed)

    def skip(self, iterator: Any, num_batches: int) -> None:
        # Workers draw from their own repeated pipelines in no fixed order, so
        # there is no position to return to; the update count is what resumes.
        if num_batches:
            logger.info("parameter_server resume: workers start fresh pipelines (no data position to skip to)")

    def agree(self, flag: bool) -> bool:
        return flag  # only the coordinator runs the loop

    def compile_loop(self, replica_fn: ReplicaFn, logs_fn: LogsFn, *, batches_per_call: int, name: str,
                     training: bool = True) -> Callable[[Any, Any], Any]:
        strategy = self.strategy

        if training:
            def loop(iterator, num_calls):
                # A Python int (see run) unrolls the steps; a tensor loops in the graph.
                for _ in (range(num_calls) if isinstance(num_calls, int) else tf.range(num_calls)):
                    batches = [next(iterator) for _ in range(batches_per_call)]
                    strategy.run(replica_fn, args=(batches,))
                return logs_fn()
        else:
            def loop(iterator, num_calls):
                # On the coordinator, in cross-replica context: no strategy.run.
                for _ in tf.range(num_calls):
                    replica_fn([next(iterator) for _ in range(batches_per_call)])
                return logs_fn()

        loop.__name__ = name
        fn = tf.function(loop, reduce_retracing=True)
        fn._tfdist_scheduled = training
        return fn

    @contextlib.contextmanager
    def _failures(self):
        """Re-raises a failure with the failed task named, after clearing it from the coordinator."""
        try:
            yield
        except Exception as e:  # noqa: BLE001 - re-raised
            self._clear_failure()
            _raise_clearly(e)

    def _clear_failure(self) -> None:
        # The strategy's one coordinator keeps the first error of a failed
        # function and raises it from the next schedule or join, whichever fit
        # that is. join() raises it once and forgets it (and waits for the
        # functions still running), so the strategy's next fit starts clean.
        for _ in range(2 * self.max_in_flight + 2):
            try:
                self.coordinator.join()
                return
            except Exception as e:  # noqa: BLE001 - already being reported
                logger.debug("Cleared a failure of the same fit from the coordinator: %s", type(e).__name__)
        logger.warning("The parameter-server coordinator still reports failures; the next fit may fail too.")

    def run(self, fn: Callable[[Any, Any], Any], iterator: Any, num_calls: int) -> Any:
        if not getattr(fn, "_tfdist_scheduled", False):
            return fn(iterator, tf.constant(num_calls, tf.int32))
        count = int(num_calls) if num_calls <= MAX_UNROLLED_STEPS else tf.constant(num_calls, tf.int32)
        with self._failures():
            return self.coordinator.schedule(fn, args=(iterator, count))

    def fetch(self, logs: Any) -> dict[str, float]:
        with self._failures():
            values = logs.fetch() if hasattr(logs, "fetch") else logs
        return {k: float(np.asarray(v)) for k, v in values.items()}

    def join(self) -> None:
        with self._failures():
            self.coordinator.join()

    def final_logs(self, logs_fn: LogsFn, last: dict[str, float]) -> dict[str, float]:
        """Logs once every scheduled step has finished (steps finish out of order)."""
        self.join()
        return {k: float(np.asarray(v)) for k, v in logs_fn().items()}
