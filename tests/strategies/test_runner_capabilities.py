"""Each runner declares what it offers beyond the Runner protocol (`tfdist.strategies.base`).

The training code asks ``isinstance(runner, Capability)``, never ``getattr`` or the strategy's
class: these are the answers it gets from the registered runners.
"""

import types

import pytest
import tensorflow as tf

import tfdist
from tfdist.strategies import registry
from tfdist.strategies.base import (
    BalancingRunner,
    ClockedRunner,
    HybridRunner,
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
    assert _declared(runner) == {"ClockedRunner"}
    assert not isinstance(runner, HybridRunner) and not isinstance(runner, BalancingRunner)


def test_the_default_strategys_runner_is_no_hybrid():
    runner = runner_for(None)
    assert _declared(runner) == {"ClockedRunner"}


def test_multi_workers_runner_balances_and_hosts_the_hybrid():
    entry = registry.get("multi_worker")
    runner = entry.runner(_one_replica_per_worker())
    assert _declared(runner) == {"ClockedRunner", "BalancingRunner", "HybridRunner"}
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
