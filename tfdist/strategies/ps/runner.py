"""The runner for ``ParameterServerStrategy``: schedule, fetch, join.

Training steps are ``tf.function`` calls scheduled on any free worker with
``ClusterCoordinator.schedule``; up to ``max_in_flight`` run ahead of the logs the loop has
fetched. Logs are exact running means, as under the sync strategies: each call sums its steps'
metrics in local tensors and adds the sums to the metric variables on the ps at its end (one
atomic ``assign_add`` each), so they hold the epoch's exact totals once every call ended; when a
callback may read batch logs, the coordinator adds up the calls' returned sums in order
(`tfdist.strategies.ps.logs`). Evaluation runs on the coordinator, reading the ps tasks'
variables. Failures: `tfdist.strategies.ps.failures`. The runner watches each worker's calls
itself (`tfdist.strategies.ps.watchdog`): beside the `Runner` protocol it is a
`SelfWatchingRunner`, a `RatedRunner` and a `WatchingRunner` (`tfdist.strategies.base`).
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import tensorflow as tf

from tfdist._compat.keras_internals.metric_state import (
    additive,
    metric_state_as_tensors,
    metric_variables,
)
from tfdist._compat.tf_internals.coordinator import wait_fetchable
from tfdist._compat.tf_internals.runtime import ps_num_workers
from tfdist.cluster import task_label
from tfdist.config import WatchdogOptions
from tfdist.data.inputs import InputSource
from tfdist.logs import as_floats
from tfdist.strategies.base import (
    CrossReplicaFn,
    LogsFn,
    LoopOptions,
    ReplicaFn,
    graph_function,
    repeat,
)
from tfdist.strategies.base import until_exhausted as until_exhausted_loop
from tfdist.strategies.ps import watchdog as ps_watchdog
from tfdist.strategies.ps.failures import ParameterServerFailure as ParameterServerFailure
from tfdist.strategies.ps.failures import lost_worker_output, raise_clearly
from tfdist.strategies.ps.logs import Packing, RunningLogs
from tfdist.strategies.ps.watchdog import WorkerWatch

logger = logging.getLogger(__name__)

#: A scheduled training call runs up to this many steps unrolled (a Python loop,
#: one trace per count), more in a ``tf.range`` loop. A ``tf.while_loop`` around
#: steps that read and update variables on the ps tasks is partitioned into a
#: loop spread over worker and ps, with extra cross-task sends and receives and
#: executor work on every call: about 5 ms of CPU per call plus 1 ms per step
#: on the in-process bench cluster, some 15% of a small CNN's step.
MAX_UNROLLED_STEPS = 16


def coordinator_for(strategy: tf.distribute.Strategy) -> Any:
    """The ``ClusterCoordinator`` of a ParameterServerStrategy (one per strategy).

    TF keeps one coordinator per strategy itself: constructing it again returns
    the same one (whose workers and queues are the strategy's), so every runner
    and benchmark on a strategy shares it.
    """
    return tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)


class PSRunner:
    """Runs replica steps on a ParameterServerStrategy through a ClusterCoordinator.

    Args:
        strategy: A ``ParameterServerStrategy``.
        stuck_timeouts: When a worker's running call counts as stuck: a
            ``WatchdogOptions``'s ``timeout`` rule (the Trainer passes its own
            ``watchdog``). By default ``ps_watchdog.DEFAULT_TIMEOUTS``: 10 x the
            longest call, within 120 s to 30 min. None watches no calls: no
            stuck workers found, no update counts.
    """

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        *,
        stuck_timeouts: WatchdogOptions | None | Literal["default"] = "default",
    ) -> None:
        if stuck_timeouts == "default":
            stuck_timeouts = ps_watchdog.DEFAULT_TIMEOUTS
        self.strategy = strategy
        self.coordinator = coordinator_for(strategy)
        self.num_workers = ps_num_workers(strategy)
        self.watch = (
            None
            if stuck_timeouts is None
            else WorkerWatch(self.coordinator, self.num_workers, stuck_timeouts)
        )
        self.max_in_flight = 2 * self.num_workers
        self._model: Any = None  # whose metrics the train functions sum per execution
        self._metric_vars: list[Any] = []
        self._packing: Packing | None = None  # how the train functions return their sums
        self._running: RunningLogs | None = None  # this epoch's sums over fetched executions
        self._last_logs: Mapping[str, float] = {}
        self._keep_logs = True  # whether train calls return their logs (expect_batch_logs)
        # The compiled loops run() schedules on workers (training); others run here, on the
        # coordinator. Weak: the Trainer owns the functions, the runner only recognises them.
        self._scheduled: weakref.WeakSet[Any] = weakref.WeakSet()

    #: Sections of the loop the fit's watchdog leaves to the runner: the coordinator waits there
    #: for workers' calls, which the runner times itself (a stuck worker is lost, not a hang).
    watched_sections = ("update", "evaluate")
    #: Workers repeat their datasets independently, so an epoch has no natural end.
    requires_steps_per_epoch = True
    reads_training_input_here = False  # workers, other processes, read the training data
    sharding_refusal = "parameter_server keeps each variable and its state once, on the ps."
    balance_refusal = "parameter_server balances by nature: a slow worker takes fewer steps."
    local_sgd_refusal = (
        "parameter_server keeps each variable once, on the ps, which every worker updates: "
        "there are no per-worker parameters to average (it is asynchronous already)."
    )
    #: ``steps_per_execution="auto"``: one step per scheduled closure. Calls already overlap
    #: (up to ``max_in_flight``), so per-call costs are not paid step after step.
    auto_steps_per_execution = 1
    #: Each step runs on one worker's one replica, so a step's outputs are never averaged: the
    #: logs are the exact sums of the metric state (see the module docstring).
    reduces_step_outputs = False

    @property
    def is_chief(self) -> bool:
        return True  # the coordinator is the only process that runs the loop

    @property
    def task_label(self) -> str:
        return task_label("chief", 0)  # the coordinator

    @property
    def loop_tasks(self) -> list[str]:
        return [self.task_label]  # the workers only serve the coordinator's closures

    def input_context(self) -> tf.distribute.InputContext:
        # What ParameterServerStrategy gives every worker's dataset_fn.
        return tf.distribute.InputContext(1, 0, self.strategy.num_replicas_in_sync)

    def distribute(self, source: InputSource, *, training: bool = True) -> Any:
        if not training:
            return source.dataset_fn(self.input_context()) if source.dataset_fn else source.dataset
        self._running = None  # a new fit: no sums left from an interrupted one
        strategy = self.strategy
        # Workers draw batches independently, so each pipeline repeats.
        if source.dataset_fn is None:
            # A dataset made here is serialised with its graph and rebuilt on
            # every worker: each worker reads all of it, as a dataset_fn does.
            return self.coordinator.create_per_worker_dataset(
                strategy.experimental_distribute_dataset(source.dataset.repeat())
            )
        dataset_fn = source.dataset_fn

        def per_worker_dataset():
            return strategy.distribute_datasets_from_function(lambda ctx: dataset_fn(ctx).repeat())

        return self.coordinator.create_per_worker_dataset(per_worker_dataset)

    def make_iterator(self, distributed: Any) -> Any:
        return iter(distributed)

    def agree(self, flag: bool) -> bool:
        return flag  # only the coordinator runs the loop

    def agree_each(self, flags: Sequence[bool]) -> tuple[bool, ...]:
        return tuple(bool(f) for f in flags)  # only the coordinator runs the loop

    def broadcast(self, values: Any) -> list[int]:
        return list(values)  # the coordinator is the chief

    def compile_loop(
        self,
        replica_fn: ReplicaFn,
        logs_fn: LogsFn,
        loop: LoopOptions,  # loop.outputs unused: logs come from the metric sums
        *,
        model: Any = None,
        cross_replica: CrossReplicaFn | None = None,  # unused: steps are whole scheduled closures
    ) -> Callable[[Any, Any], Any]:
        strategy, batches_per_call, training = self.strategy, loop.batches_per_call, loop.training
        if loop.until_exhausted:  # evaluation only: fit requires steps_per_epoch here
            return until_exhausted_loop(lambda batch: replica_fn([batch]), logs_fn, loop.name)
        per_execution = training and self._sum_metrics_of(model)
        variables, packing = self._metric_vars, self._packing

        def one_step(iterator):
            strategy.run(replica_fn, args=([next(iterator) for _ in range(batches_per_call)],))

        if training:

            def run_calls(iterator, num_calls, returns_logs=True):
                # A Python int (see run) unrolls the steps; a tensor loops in the graph.
                if not per_execution:
                    _steps(num_calls, lambda: one_step(iterator))
                    return logs_fn() if returns_logs else None
                state, logs = _summed_steps(
                    variables,
                    num_calls,
                    lambda: one_step(iterator),
                    logs_fn if returns_logs else dict,
                )
                # The call's sums, each added to its metric variable on the ps in one atomic op:
                # once every call ended, the variables hold the exact totals.
                for variable, total in zip(variables, state):
                    variable.assign_add(total)
                return packing.pack(logs, state) if returns_logs else None
        else:

            def run_calls(iterator, num_calls):
                # On the coordinator, in cross-replica context: no strategy.run.
                _steps(
                    num_calls, lambda: replica_fn([next(iterator) for _ in range(batches_per_call)])
                )
                return logs_fn()

        run_calls.__name__ = loop.name
        fn = graph_function(run_calls)
        if training:
            self._scheduled.add(fn)
        return fn

    def metrics_result(self, model: Any) -> dict[str, tf.Tensor]:
        # Read where the variables live; scheduled training calls also sum their own (see above).
        return model.get_metrics_result()

    def compile_predict(
        self, replica_fn: ReplicaFn, *, name: str = "predict_function"
    ) -> Callable[[Any], Any]:
        # Like evaluation, on the coordinator (variables read from the ps tasks): outputs keep
        # the data's order.
        replica_fn.__name__ = name
        return graph_function(replica_fn)

    def _sum_metrics_of(self, model: Any) -> bool:
        """Whether train functions sum ``model``'s metrics per execution (see module docstring)."""
        if model is None:
            return False
        variables = metric_variables(model)
        if not additive(variables):
            logger.warning(
                "A metric keeps state that is not a sum; its mid-epoch logs under parameter_server "
                "are read while other steps update it and may be inexact (epoch-end logs are "
                "exact)."
            )
            return False
        if model is not self._model or list(map(id, variables)) != list(map(id, self._metric_vars)):
            self._model, self._metric_vars = model, variables
            self._packing = Packing(variables)
        return bool(variables)

    def _metric_logs(self, state: list[np.ndarray]) -> dict[str, float]:
        """The model's metric results with its metric variables holding ``state``."""
        with metric_state_as_tensors(self._metric_vars, state):
            # Read inside: a metric's result may be its variable itself, not a copy.
            return as_floats(self._model.get_metrics_result())

    @contextlib.contextmanager
    def _failures(self):
        """Re-raises a failure naming the failed task, after clearing it from the coordinator."""
        try:
            yield
        except Exception as e:  # noqa: BLE001 - re-raised
            self._clear_failure()
            raise_clearly(e)

    def _clear_failure(self) -> None:
        # The strategy's one coordinator keeps the first error of a failed
        # function and raises it from the next schedule or join, whichever fit
        # that is. join() raises it once and forgets it (and waits for the
        # functions still running), so the strategy's next fit starts clean.
        self._running = None
        for _ in range(2 * self.max_in_flight + 2):
            try:
                self.coordinator.join()
                return
            except Exception as e:  # noqa: BLE001 - already being reported
                logger.debug(
                    "Cleared a failure of the same fit from the coordinator: %s", type(e).__name__
                )
        logger.warning(
            "The parameter-server coordinator still reports failures; the next fit may fail too."
        )

    def run(self, fn: Callable[[Any, Any], Any], iterator: Any, num_calls: int) -> Any:
        if fn not in self._scheduled:
            return fn(iterator, tf.constant(num_calls, tf.int32))
        count = (
            int(num_calls) if num_calls <= MAX_UNROLLED_STEPS else tf.constant(num_calls, tf.int32)
        )
        if self.watch is not None:
            self.watch.attach()
        with self._failures():
            return self.coordinator.schedule(fn, args=(iterator, count, self._keep_logs))

    def expect_batch_logs(self, read: bool) -> None:
        # Unread, a call returns nothing: TF's coordinator copies no outputs to this process.
        self._keep_logs = read

    def fetch(self, logs: Any) -> Mapping[str, float]:
        """Waits for a call; its running logs, computed when first read (``ps_logs``)."""
        try:
            if hasattr(logs, "fetch") and self.watch is not None:
                wait_fetchable(logs, lambda: self.watch.failure)
            values = logs.fetch() if hasattr(logs, "fetch") else logs
        except Exception as e:  # noqa: BLE001 - re-raised unless only the logs were lost
            verdict = self.watch.failure if self.watch is not None else None
            if verdict is not None:  # a stuck worker failed the fit; e is a call it cancelled
                self._clear_failure()
                raise verdict from e
            worker = lost_worker_output(e)
            if worker is None:
                self._clear_failure()
                raise_clearly(e)
            # The call ran (its updates and metric sums are on the ps), but its worker stopped
            # before the coordinator copied its logs: they are gone. The running means then
            # leave out its steps until the epoch's end.
            logger.warning(
                "The logs of one scheduled call were lost: %s stopped after running it. Its "
                "updates were applied; the running means logged before the epoch's end leave "
                "out its steps.",
                worker,
            )
            return self._last_logs
        if values is None:  # nothing reads batch logs (expect_batch_logs)
            return {}
        if isinstance(values, np.ndarray):  # a train function's packed logs and metric sums
            if self._running is None:
                self._running = RunningLogs(self._packing, self._metric_logs)
            self._last_logs = self._running.add(values)
            return self._last_logs
        self._last_logs = as_floats(values)
        return dict(self._last_logs)

    def worker_update_counts(self) -> dict[str, int]:
        """Training calls each worker finished, e.g. ``{"worker:0": 61, "worker:1": 59}``.

        Each call runs ``steps_per_execution`` updates. Empty when calls are not watched.
        """
        return self.watch.update_counts() if self.watch else {}

    def worker_update_rates(self, *, log: bool = False) -> dict[str, float]:
        """Each worker's finished calls per second over the last 30 s, e.g. ``{"worker:0": 9.5}``.

        Args:
            log: Also log them, with the counts (INFO, ``tfdist.strategies.ps.watchdog``).
        """
        if self.watch is None:
            return {}
        return self.watch.log_update_rates() if log else self.watch.update_rates()

    def join(self) -> None:
        with self._failures():
            self.coordinator.join()

    def final_logs(self, logs_fn: LogsFn, last: dict[str, float]) -> dict[str, float]:
        """Logs once every scheduled step has finished (steps finish out of order)."""
        self.join()
        self._running = None
        # Every call added its sums to the metric variables: they hold the epoch's totals.
        return as_floats(logs_fn())


def _summed_steps(
    variables: list[Any], num_calls: Any, step: Callable[[], Any], logs_fn: LogsFn
) -> tuple[list[tf.Tensor], Mapping[str, Any]]:
    """Runs ``step()`` ``num_calls`` times with ``variables`` summed in local tensors from zero.

    Returns the sums (one tensor per variable) and ``logs_fn()`` over them. Traced on a worker.
    """
    with metric_state_as_tensors(variables) as boxes:

        def body(state):
            for box, value in zip(boxes, state):
                box.current = value
            step()
            return tuple(box.current for box in boxes)

        state = tuple(box.current for box in boxes)
        if isinstance(num_calls, int):
            for _ in range(num_calls):
                state = body(state)
        else:
            state = repeat(num_calls, body, state)
        for box, value in zip(boxes, state):
            box.current = value
        return list(state), logs_fn()


def _steps(num_calls: Any, step: Callable[[], Any]) -> None:
    """``step()`` ``num_calls`` times: unrolled for a Python int, else in a symbolic loop."""
    if isinstance(num_calls, int):
        for _ in range(num_calls):
            step()
        return

    def body(state: tuple) -> tuple:
        step()
        return state

    repeat(num_calls, body)
