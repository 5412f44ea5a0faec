"""The runner protocol: how one training loop drives every strategy.

``Trainer`` decides *when* a step happens; a runner decides *how* it is
executed on its strategy; ``training/step/update.py`` decides *what* a step does.
Everything that differs between strategies is a method here, so the training
loop holds no ``isinstance(strategy, ...)``. What only some runners offer is a capability,
declared below as a protocol of its own (`ClockedRunner`, `SelfWatchingRunner`,
`RatedRunner`, `WatchingRunner`, `BalancingRunner`, `HybridRunner`) and asked for with
``isinstance(runner, Capability)``, as Lightning Fabric's strategies declare theirs as mix-ins.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import tensorflow as tf

from tfdist.config import WatchdogOptions
from tfdist.data.inputs import InputSource
from tfdist.strategies.step_clock import StepClock


def graph_function(fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
    """``tf.function(fn, reduce_retracing=True, autograph=False)``: a runner's compiled function.

    No AutoGraph, as in Keras's own ``fit`` (its step functions are
    ``do_not_convert``): a model's ``call`` and ``train_step`` run as they do
    there, and tfdist's step code is not rewritten at every first trace (that
    rewrite cost 3.4 s of a 4.6 s first 10-step fit). Loops over calls are
    explicit ``tf.while_loop``s (`repeat`).
    """
    return tf.function(fn, reduce_retracing=True, autograph=False, **options)


def repeat(n: Any, body: Callable[[Any], Any], state: Any = ()) -> Any:
    """``state = body(state)`` ``n`` times in a symbolic loop (``n`` a tensor); returns ``state``.

    ``state`` is a (possibly empty) tuple of tensors; ``body`` returns the same structure.
    """
    _, state = tf.while_loop(
        lambda i, _: i < n,
        lambda i, carried: (i + 1, body(carried)),
        (tf.constant(0, getattr(n, "dtype", tf.int32)), state),
    )
    return state


#: The key under which a loop compiled ``until_exhausted`` returns the calls it ran.
STEPS_RUN_KEY = "_tfdist_steps_run"


def until_exhausted(
    run_step: Callable[[Any], Any], logs_fn: Callable[[], Any], name: str
) -> Callable[..., Any]:
    """``fn(iterator, num_calls)`` for data of unknown length: up to ``num_calls`` calls of
    ``run_step(batch)``, fewer when the data runs out; its logs hold the calls run under
    `STEPS_RUN_KEY` (see ``Runner.compile_loop``).

    ``iterator.get_next_as_optional()`` says whether there is a next batch. On TF's
    distributed iterator that "any replica has data" is all-reduced across the workers, so
    every worker leaves the loop at the same call; a replica past the end gets an empty batch.
    """

    def loop(iterator, num_calls):
        def body(done, _):
            optional = iterator.get_next_as_optional()
            more = optional.has_value()

            def step():
                run_step(optional.get_value())
                return tf.constant(1)

            return done + tf.cond(more, step, lambda: tf.constant(0)), more

        done, _ = tf.while_loop(
            lambda done, more: tf.logical_and(more, done < num_calls),
            body,
            (tf.constant(0), tf.constant(True)),
            parallel_iterations=1,
        )
        return {**logs_fn(), STEPS_RUN_KEY: done}

    loop.__name__ = name
    return graph_function(loop)


ReplicaFn = Callable[..., Any]
LogsFn = Callable[[], Mapping[str, tf.Tensor]]
#: ``drive(run, next_batch)``: one update from cross-replica context (see
#: ``training/step/update.py``).
CrossReplicaFn = Callable[[Callable[..., Any], Callable[[], Any]], None]


@dataclasses.dataclass(frozen=True)
class LoopOptions:
    """What kind of loop ``Runner.compile_loop`` builds.

    Attributes:
        name: The compiled function's name (``"train_function"``, ``"test_function"``).
        batches_per_call: Per-replica batches each call of the replica step receives (the
            micro-batches of one update).
        training: A training loop (else evaluation: a runner may run it elsewhere, untimed).
        outputs: Hand ``logs_fn`` the last call's outputs (see ``Runner.compile_loop``).
        until_exhausted: Stop early when data of unknown length runs out (one batch per call).
    """

    name: str
    batches_per_call: int = 1
    training: bool = True
    outputs: bool = False
    until_exhausted: bool = False


@runtime_checkable
class Runner(Protocol):
    """Executes replica steps on one ``tf.distribute.Strategy``."""

    strategy: tf.distribute.Strategy

    @property
    def is_chief(self) -> bool:
        """Whether this process writes logs, summaries and checkpoints."""

    @property
    def task_label(self) -> str:
        """``task_type:task_id`` of this process, for logs and temporary paths."""

    @property
    def loop_tasks(self) -> list[str]:
        """The labels of every process that runs the training loop in lockstep with this one."""

    def input_context(self) -> tf.distribute.InputContext:
        """This process's input pipelines and replicas, as a dataset_fn would see them."""

    max_in_flight: int
    """Calls that may run ahead of the logs the loop has fetched (0: fetch each)."""

    requires_steps_per_epoch: bool
    """Whether ``fit`` needs an explicit ``steps_per_epoch`` on this strategy."""

    #: Why sharded optimizer state (``ExchangeOptions(sharding=...)``) cannot run here, or None.
    sharding_refusal: str | None
    #: Why balanced batches (``Trainer(balance=...)``) cannot run here, or None; where they can,
    #: the runner is a `BalancingRunner`.
    balance_refusal: str | None
    #: Why local SGD (``Trainer(local_sgd=...)``) cannot run here, or None.
    local_sgd_refusal: str | None

    reads_training_input_here: bool
    """Whether this process reads the training batches it trains on (not other processes):
    only then can they come from Python code here (a generator, a ``keras.utils.PyDataset``)."""

    auto_steps_per_execution: int
    """What ``steps_per_execution="auto"`` runs per call when no callback needs every batch."""

    reduces_step_outputs: bool
    """Whether ``compile_loop`` with ``LoopOptions(outputs=True)`` passes the last call's
    outputs to ``logs_fn``."""

    def distribute(self, source: InputSource, *, training: bool = True) -> Any:
        """Turns an input source into the strategy's distributed dataset.

        For an evaluation source (``training=False``) a runner may hand back the one it made
        before for the same source object (a fit validates on one source every epoch); each
        pass is a fresh `make_iterator`, as Keras's ``fit`` keeps its validation's dataset.
        """

    def make_iterator(self, distributed: Any) -> Any:
        """Creates an iterator over a distributed dataset (one per epoch or run)."""

    def agree(self, flag: bool) -> bool:
        """True on every process if ``flag`` is true on any (e.g. a SIGTERM on one worker)."""

    def agree_each(self, flags: Sequence[bool]) -> tuple[bool, ...]:
        """`agree` of every flag at once, in one collective: flag ``i`` is true on every process
        if it is true on any (the loop's stop vote: a stop asked for, and a SIGTERM among them).
        Every process passes as many flags."""

    def broadcast(self, values: Sequence[int]) -> list[int]:
        """The chief's ``values`` (small non-negative ints), on every process.

        Every process must call it with the same number of values, e.g. so
        that all workers resume from the chief's backup position.
        """

    def compile_loop(
        self,
        replica_fn: ReplicaFn,
        logs_fn: LogsFn,
        loop: LoopOptions,
        *,
        model: Any = None,
        cross_replica: CrossReplicaFn | None = None,
    ) -> Callable[[Any, int], Any]:
        """Builds ``fn(iterator, num_calls)``: runs ``replica_fn`` ``num_calls`` times.

        Each call of ``replica_fn`` receives a list of ``loop.batches_per_call``
        per-replica batches and runs in replica context. ``fn`` returns
        ``logs_fn()`` evaluated in cross-replica context after the last call.
        ``model`` is the Keras model whose metrics ``replica_fn`` updates (a
        runner whose steps overlap may track them per call to log exact means).

        ``cross_replica(run, next_batch)``, when given, is the same update as
        ``replica_fn`` driven from cross-replica context (see
        ``training/step/update.py``): a runner that can fetch batches between replica
        calls calls it once per update instead, so the micro-batch loop stays
        symbolic; ``run(fn, args)`` runs ``fn`` on every replica. A runner that
        cannot ignores it.

        ``loop.outputs``: when the runner ``reduces_step_outputs``, ``fn`` returns
        ``logs_fn(reduced)``, where ``reduced`` is the last call's return value
        averaged over all replicas (a model's own ``train_step`` logs, as
        Keras's fit reduces them); other runners ignore it.

        ``loop.until_exhausted`` (one batch per call): for data of unknown length, ``fn`` stops
        early when the data runs out, the end agreed by every replica and worker (TF's
        ``get_next_as_optional``, which hands replicas past the end an empty batch while
        another still has one), and its logs hold the calls it ran under
        `STEPS_RUN_KEY`. A runner that cannot stop in step on every worker refuses it.
        """

    def metrics_result(self, model: Any) -> dict[str, tf.Tensor]:
        """``model.get_metrics_result()`` in cross-replica context, inside a ``tf.function``.

        A runner may reduce all metric state in fewer collectives, as long as
        the results are the same sums.
        """

    def compile_predict(
        self, replica_fn: ReplicaFn, *, name: str = "predict_function"
    ) -> Callable[[Any], Any]:
        """Builds ``fn(batch)`` for a batch of ``distribute(..., training=False)``.

        ``fn`` runs ``replica_fn(batch)`` on every replica and returns all
        replicas' outputs concatenated in input order, in cross-replica context.
        """

    def run(self, fn: Callable[[Any, int], Any], iterator: Any, num_calls: int) -> Any:
        """Starts ``fn`` (synchronously or by scheduling) and returns its logs handle."""

    def expect_batch_logs(self, read: bool) -> None:
        """Whether the callbacks of the coming fit may read the logs of training batches.

        Epoch-end logs are always exact; a runner may keep no batch logs when
        nothing reads them (and then hand out empty ones).
        """

    def fetch(self, logs: Any) -> Mapping[str, float]:
        """Waits for a logs handle and returns its logs as plain Python floats.

        A runner may return a ``tfdist.logs.LazyLogs``, whose values are
        computed when first read.
        """

    def join(self) -> None:
        """Waits until every scheduled function has finished (a no-op for sync)."""

    def final_logs(self, logs_fn: LogsFn, last: dict[str, float]) -> dict[str, float]:
        """The epoch's logs once all its steps are done (``last`` for sync strategies)."""


# What a runner may offer beyond `Runner`. Each capability is a protocol of its own, asked for
# with ``isinstance(runner, Capability)`` (runtime-checkable: the members are there), never with
# ``getattr`` probes or the strategy's class. A runner declares one by having its members.


class RunnerStuckError(RuntimeError):
    """A call the runner waits for cannot finish: a task it runs on is stuck and no other can
    stand in. The fit's watchdog exits on it with ``STUCK_EXIT_CODE``, as on a hang it found
    itself (parameter_server: `tfdist.strategies.ps.failures.WorkerStuckError`)."""


@runtime_checkable
class ClockedRunner(Protocol):
    """Times each update's sections on this worker (input, compute, the wait for the
    exchange) while ``step_clock.enabled``: the straggler report's windows
    (`tfdist.strategies.step_clock`). The sync runners."""

    step_clock: StepClock


@runtime_checkable
class MetricResettingRunner(Protocol):
    """Resets a model's metrics with no collective: Keras's reset, in cross-replica context,
    reads each replica-local variable back (an all-reduce each on multi_worker). The sync
    runners."""

    def reset_metrics(self, model: Any) -> None:
        """``model.reset_metrics()``, the same state after it, each replica's copy reset where
        it lives."""


@runtime_checkable
class SelfWatchingRunner(Protocol):
    """Times some sections of the loop itself, which the fit's watchdog then leaves to it
    (parameter_server: the coordinator waits there for workers' calls, and a stuck worker is
    lost, not a hang of the loop)."""

    watched_sections: tuple[str, ...]


@runtime_checkable
class RatedRunner(Protocol):
    """Counts each worker's finished calls: its straggler report is their rates
    (parameter_server, where a slow worker takes fewer steps)."""

    def worker_update_rates(self, *, log: bool = False) -> dict[str, float]:
        """Each worker's finished calls per second lately, e.g. ``{"worker:0": 9.5}``; with
        ``log``, also logged."""


class CallWatch(Protocol):
    """The watch a `WatchingRunner` keeps over its workers' calls, as the fit sets it."""

    #: Whether a call that outlives its timeout counts as stuck (the fit has a watchdog).
    checking: bool
    #: The rule of a call's timeout (the fit's ``WatchdogOptions``).
    timeouts: WatchdogOptions | None


@runtime_checkable
class WatchingRunner(Protocol):
    """Watches each worker's calls for ones that never finish; the fit's watchdog options set
    its rule (parameter_server). ``watch`` is None when the runner was made to watch nothing."""

    watch: CallWatch | None


class BatchShares(Protocol):
    """The split of every global batch a `BalancingRunner` trains on
    (`tfdist.strategies.balanced_split.BalancedSplit`)."""

    #: Processes in sync, and replicas in each.
    workers: int
    local_replicas: int
    #: This worker's per-update sections since the balancer last took them.
    clock: StepClock

    def set(self, shares: Sequence[int]) -> None:
        """Examples per worker of every global batch from the next call on (alike on all)."""

    def gather(self, row: Sequence[float]) -> np.ndarray:
        """Every worker's ``row``, in worker order (one collective)."""


@runtime_checkable
class BalancingRunner(Protocol):
    """Splits each global batch between its workers by their speed (``Trainer(balance=)``,
    `tfdist.training.balance`): multi_worker. ``balanced`` is None until `enable_balance`."""

    balanced: BatchShares | None

    def enable_balance(self) -> BatchShares:
        """Trains on balanced shares of every global batch from now on; returns the split."""


@runtime_checkable
class HybridRunner(Protocol):
    """Data parallel over workers whose replica a pipeline can span: with one replica per
    worker (``make_strategy("multi_worker", stage_devices=K)``), each worker's replica is a
    pipeline over this worker's devices (``Trainer(pipeline=)``, the hybrid)."""

    @property
    def replica_devices(self) -> list[str]:
        """This worker's replica devices: the hybrid's one is its first stage's device."""
