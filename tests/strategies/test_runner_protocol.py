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


def test_a_sync_runner_distributes_an_evaluation_source_once_while_it_lives():
    # Keras's fit keeps its validation's distributed dataset; each pass is a fresh iterator.
    import gc

    import numpy as np
    import tensorflow as tf

    from tfdist.data.inputs import InputSource
    from tfdist.strategies.sync import SyncRunner

    runner = SyncRunner(tf.distribute.OneDeviceStrategy("/cpu:0"))
    dataset = tf.data.Dataset.from_tensor_slices(np.arange(6.0)).batch(4)
    source = InputSource(4, dataset.element_spec, 2, dataset=dataset)
    evaluation = runner.distribute(source, training=False)
    assert runner.distribute(source, training=False) is evaluation
    passes = [[float(x) for b in runner.make_iterator(evaluation) for x in b] for _ in range(2)]
    assert passes == [[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]] * 2
    assert runner.distribute(source) is not evaluation  # training: built for each epoch
    del source, evaluation
    gc.collect()
    assert runner._evaluation_inputs == {}  # forgotten with its source
