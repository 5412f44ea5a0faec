"""Tests for tfdist.launch.notebook_launcher: real worker processes on loopback.

The functions run in the tasks are defined at module level here: cloudpickle
pickles them by reference (``tests.launch.test_notebook_launcher.<name>``) and
each task imports this module again, which works because the launcher gives
the tasks a PYTHONPATH made of the current directory and ``sys.path``.
"""

import os

import pytest

from tests.helpers import PRELOAD_MODULES
from tfdist.launch import notebook_launcher

pytestmark = pytest.mark.multiprocess


def train_digits_one_epoch():
    import json

    import tfdist
    import tfdist.bench.harness.worker_common

    strategy = tfdist.make_strategy("multi_worker")  # first: before any other TF work

    import keras

    trainer = tfdist.Trainer(
        lambda: tfdist.models.get("mlp", hidden_units=(32,)),
        strategy=strategy,
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    history = trainer.fit(tfdist.data.load("digits"), epochs=1, global_batch_size=64, verbose=0)
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    return {
        "task": f"{task['type']}:{task['index']}",
        "pid": os.getpid(),
        "preloaded": tfdist.bench.harness.worker_common.forked_from_preload(),
        "num_replicas_in_sync": strategy.num_replicas_in_sync,
        "is_chief": trainer.is_chief,
        "history": history.history,
    }


def always_fails(message):
    raise ValueError(message)


def test_multi_worker_training_returns_the_chiefs_result():
    result = notebook_launcher(
        train_digits_one_epoch, num_workers=2, timeout=120, preload=PRELOAD_MODULES
    )
    assert result["task"] == "worker:0" and result["is_chief"]
    assert result["preloaded"]  # forked from the Python that imported TF and Keras
    assert result["pid"] != os.getpid()  # it ran in a task process, not here
    assert result["num_replicas_in_sync"] == 2
    assert set(result["history"]) == {"loss", "accuracy"}
    assert len(result["history"]["loss"]) == 1
    assert result["history"]["accuracy"][0] > 0.3  # chance is 0.1: it learnt


def test_a_failing_function_raises_runtime_error(capsys):
    with pytest.raises(RuntimeError, match="notebook_launcher job failed"):
        notebook_launcher(always_fails, "boom from the task", num_workers=2, timeout=120)
    out = capsys.readouterr().out
    # The failing task's traceback reaches the caller's stdout, prefixed by its task.
    assert (
        "[worker:0] ValueError: boom from the task" in out
        or "[worker:1] ValueError: boom from the task" in out
    )


@pytest.mark.parametrize("bad", [0, -1])
def test_bad_num_workers_is_a_value_error(bad):
    with pytest.raises(ValueError, match="num_workers"):
        notebook_launcher(always_fails, "never runs", num_workers=bad)


def test_a_bad_preload_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match=r"argument `preload`.*'tensor flow'.*module names"):
        notebook_launcher(always_fails, "never runs", preload=["tensor flow"])
