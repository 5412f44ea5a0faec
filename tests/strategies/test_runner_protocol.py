"""Every registered runner implements exactly the Runner protocol the training loop uses."""

import inspect

import pytest

from tfdist.strategies import registry
from tfdist.strategies.base import Runner

#: Members a runner sets in ``__init__`` (checked on an instance where one is cheap to make).
INSTANCE_ATTRIBUTES = {"strategy", "max_in_flight"}


def _members():
    declared = {name for name in vars(Runner) if not name.startswith("_")}
    return declared | set(Runner.__annotations__)


RUNNERS = sorted({entry.runner for entry in registry.entries()}, key=lambda c: c.__name__)


def test_the_protocol_is_what_the_loop_uses():
    # Metrics and "auto" are members, not getattr lookups.
    assert {"metrics_result", "auto_steps_per_execution"} <= _members()
    assert "cross_replica" in inspect.signature(Runner.compile_loop).parameters


@pytest.mark.parametrize("runner", RUNNERS, ids=lambda c: c.__name__)
def test_each_runner_has_every_member_with_the_protocols_signature(runner):
    missing = [
        name for name in sorted(_members() - INSTANCE_ATTRIBUTES) if not hasattr(runner, name)
    ]
    assert missing == []
    assert isinstance(runner.auto_steps_per_execution, int) and runner.auto_steps_per_execution >= 1
    for name, member in vars(Runner).items():
        if callable(member) and not name.startswith("_"):
            expected = list(inspect.signature(member).parameters)
            assert list(inspect.signature(getattr(runner, name)).parameters) == expected, name


def test_a_sync_runner_instance_is_a_runner():
    import tensorflow as tf

    from tfdist.strategies.sync import SyncRunner

    runner = SyncRunner(tf.distribute.get_strategy())
    assert isinstance(runner, Runner)
    assert all(hasattr(runner, name) for name in INSTANCE_ATTRIBUTES)
