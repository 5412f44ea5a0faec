"""Each runner declares what it offers beyond the Runner protocol (`tfdist.strategies.base`).

The training code asks ``isinstance(runner, Capability)``, never ``getattr`` or the strategy's
class: these are the answers it gets from the registered runners.
"""

import types

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.strategies import registry
from tfdist.strategies.base import (
    BalancingRunner,
    ClockedRunner,
    HybridRunner,
    MetricResettingRunner,
    RatedRunner,
    Runner,
    RunnerStuckError,
    SelfWatchingRunner,
    WatchingRunner,
)
from tfdist.strategies.factory import runner_for
from tfdist.strategies.ps.failures import WorkerStuckError
from tfdist.strategies.ps.runner import PSRunner

CAPABILITIES = (
    ClockedRunner,
    SelfWatchingRunner,
    RatedRunner,
    WatchingRunner,
    BalancingRunner,
    HybridRunner,
    MetricResettingRunner,
)


def _declared(runner) -> set[str]:
    return {c.__name__ for c in CAPABILITIES if isinstance(runner, c)}


def _one_replica_per_worker() -> tf.distribute.Strategy:
    """A MultiWorkerMirroredStrategy as the hybrid's looks (no cluster started)."""
    strategy = object.__new__(tf.distribute.MultiWorkerMirroredStrategy)
    strategy._extended = types.SimpleNamespace(worker_devices=("/cpu:0",))
    return strategy


def _ps_runner() -> PSRunner:
    """A PSRunner as it is once made, without its cluster: what it declares is its class's."""
    runner = object.__new__(PSRunner)
    runner.watch = None  # made with stuck_timeouts=None
    return runner


def test_one_device_keeps_a_step_clock_and_nothing_more():
    runner = runner_for(tfdist.make_strategy("one_device"))
    assert isinstance(runner, Runner)
    assert _declared(runner) == {"ClockedRunner", "MetricResettingRunner"}
    assert not isinstance(runner, HybridRunner) and not isinstance(runner, BalancingRunner)


def test_the_default_strategys_runner_is_no_hybrid():
    runner = runner_for(None)
    assert _declared(runner) == {"ClockedRunner", "MetricResettingRunner"}


def test_multi_workers_runner_balances_and_hosts_the_hybrid():
    entry = registry.get("multi_worker")
    runner = entry.runner(_one_replica_per_worker())
    assert _declared(runner) == {
        "ClockedRunner",
        "MetricResettingRunner",
        "BalancingRunner",
        "HybridRunner",
    }
    assert runner.balance_refusal is None and runner.balanced is None
    assert runner.replica_devices == ["/cpu:0"]


def test_a_ps_runner_watches_its_workers_and_neither_balances_nor_hosts_a_hybrid():
    runner = _ps_runner()
    assert _declared(runner) == {"SelfWatchingRunner", "RatedRunner", "WatchingRunner"}
    assert runner.watched_sections == ("update", "evaluate")
    assert runner.balance_refusal is not None


@pytest.mark.parametrize("kind", ["one_device", "mirrored"])
def test_runners_that_refuse_balance_do_not_declare_it(kind):
    runner = registry.get(kind).runner
    assert not hasattr(runner, "enable_balance")
    assert not hasattr(runner, "replica_devices")


def test_the_ps_runners_stuck_worker_is_the_error_the_watchdog_exits_on():
    # The health monitor knows only the base error; the PS-only one stays in strategies/ps.
    assert issubclass(WorkerStuckError, RunnerStuckError)
    assert issubclass(RunnerStuckError, RuntimeError)


class _SumFrom(keras.metrics.Metric):
    """A summed metric reset to 3, not 0: TF's cross-replica assignment spreads 3 / replicas."""

    def __init__(self):
        super().__init__(name="sum_from")
        self.total = self.add_variable((), initializer="zeros", aggregation="sum", name="total")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.total.assign_add(1.0)

    def reset_state(self):
        self.total.assign(3.0)

    def result(self):
        return self.total


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_sync_runner_resets_metrics_to_kerass_state_with_no_collective(replicas):
    """Also on one replica (one worker of ``multi_worker``): Keras's reset reads the variables
    back there too (about 11 ms an epoch's reset on digits)."""
    strategy = tfdist.make_strategy("mirrored", num_devices=replicas)
    runner = runner_for(strategy)
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse", metrics=["mae", _SumFrom()])
    model.fit(np.ones((4, 2)), np.ones((4, 1)), batch_size=2, epochs=1, verbose=0)
    variables = model.metrics_variables

    def state():
        return [
            [c.numpy() for c in strategy.experimental_local_results(v.value)] for v in variables
        ]

    model.reset_metrics()
    expected = state()
    for v in variables:  # each replica's copy made different again
        for i, c in enumerate(strategy.experimental_local_results(v.value)):
            c.assign(tf.fill(c.shape, tf.cast(i + 5, c.dtype)))
    runner.reset_metrics(model)
    assert str(state()) == str(expected)
    total = next(v for v in variables if v.path == "sum_from/total")
    # Keras's cross-replica reset spreads 3 as 1.5 on each of 2 replicas (read: 3).
    copies = [float(c) for c in strategy.experimental_local_results(total.value)]
    assert copies == [3.0 / replicas] * replicas
