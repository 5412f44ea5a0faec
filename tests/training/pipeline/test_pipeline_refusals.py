"""Pipeline stages' refusals (issue 35): one clear error each, naming the argument.

Nothing here trains beyond a first trace; the models are `tests.training.pipeline.test_pipeline`'s.
"""

from __future__ import annotations

import types

import keras
import pytest
import tensorflow as tf

import tfdist
from tests.training.pipeline.test_pipeline import LOSS, SPLIT, X, Y, mlp
from tfdist.training.pipeline.options import PipelineOptions, resolve_devices


def refused(match: str, make, **fit) -> None:
    with pytest.raises(ValueError, match=match) as info:
        trainer = make()
        trainer.fit(X[:32], Y[:32], verbose=0, **fit)
    assert type(info.value) is ValueError and "\n" not in str(info.value)


def trainer_with(model=mlp, **options):
    return lambda: tfdist.Trainer(
        model, loss=LOSS, pipeline=PipelineOptions(**{"split_at": SPLIT, **options})
    )


def with_batch_norm() -> keras.Model:
    inputs = keras.Input((8,))
    h = keras.layers.Dense(8, name="d1")(inputs)
    h = keras.layers.BatchNormalization(name="bn")(h)
    return keras.Model(inputs, keras.layers.Dense(3, name="out")(h))


def test_refuses_a_layer_the_model_does_not_have():
    refused(
        r"`split_at`. Received: split_at=\['d1', 'nope'\].*'nope' is not one of them",
        trainer_with(split_at=["d1", "nope"]),
    )


def tied() -> keras.Model:
    """``tied`` called twice: which call would a cut after it follow?"""
    inputs = keras.Input((8,))
    dense = keras.layers.Dense(8, name="tied")
    h = dense(keras.layers.Dense(8, name="d0")(inputs))
    h = dense(keras.layers.Dense(8, name="d1")(h))
    return keras.Model(inputs, keras.layers.Dense(3, name="out")(h))


def test_refuses_a_layer_called_twice():
    refused(
        r"`split_at`.*'tied' is called 2 times; a cut follows a layer called once",
        trainer_with(tied, split_at=["tied"]),
    )


def test_refuses_a_cut_after_the_last_layer():
    refused(
        r"`split_at`.*in its order \(d1, d2, d3\). The model cannot be cut after 'out': the "
        r"last stage would be empty",
        trainer_with(split_at=["d1", "out"]),
    )


def test_refuses_cuts_out_of_order():
    refused(r"`split_at`.*'d1' does not come after 'd2'", trainer_with(split_at=["d2", "d1"]))


def test_refuses_a_subclassed_model():
    class Plain(keras.Model):
        def __init__(self):
            super().__init__()
            self.d1 = keras.layers.Dense(3, name="d1")

        def call(self, x):
            return self.d1(x)

    refused(
        r"`pipeline`.*None for a model that is not a Sequential or functional keras.Model",
        trainer_with(Plain, split_at=["d1"]),
    )


def test_refuses_batch_norm_over_micro_batches_unless_accepted():
    refused(
        r"`micro_batches`. Received: micro_batches=2.*allow_batch_norm=True",
        trainer_with(with_batch_norm, split_at=["d1"], micro_batches=2),
    )
    trainer_with(with_batch_norm, split_at=["d1"], micro_batches=2, allow_batch_norm=True)()
    trainer_with(with_batch_norm, split_at=["d1"], micro_batches=1)()


def test_refuses_a_custom_train_step():
    class Own(keras.Model):
        def train_step(self, data):
            return super().train_step(data)

    def own() -> keras.Model:
        inputs = keras.Input((8,))
        h = keras.layers.Dense(8, name="d1")(inputs)
        return Own(inputs, keras.layers.Dense(3, name="out")(h))

    refused(
        r"`pipeline`.*None for a model with its own train_step", trainer_with(own, split_at=["d1"])
    )


@pytest.mark.parametrize("kind", ["mirrored", "one_device"])
def test_refuses_a_strategy(kind):
    strategy = tfdist.make_strategy(kind)
    refused(
        r"`strategy`.*None \(the default strategy: all stages in this process\) or a "
        r"MultiWorkerMirroredStrategy",
        lambda: tfdist.Trainer(mlp, strategy=strategy, loss=LOSS, pipeline=PipelineOptions(SPLIT)),
    )


def test_refuses_a_multi_worker_strategy_of_several_replicas_per_worker():
    # A MultiWorkerMirroredStrategy that took 2 GPUs per worker, without a cluster to start.
    strategy = object.__new__(tf.distribute.MultiWorkerMirroredStrategy)
    strategy._extended = types.SimpleNamespace(worker_devices=("/gpu:0", "/gpu:1"))
    refused(
        r"`strategy`. Received: strategy='MultiWorkerMirroredStrategy with 2 replicas per "
        r"worker'. Expected one replica per worker.*stage_devices=K",
        lambda: tfdist.Trainer(mlp, strategy=strategy, loss=LOSS, pipeline=PipelineOptions(SPLIT)),
    )


def test_the_hybrids_stages_are_each_workers_own_devices():
    worker = "/job:worker/replica:0/task:1/device:CPU:0"
    options = PipelineOptions(["a"], devices=["/device:CPU:0", "/cpu:1"])
    assert resolve_devices(options, worker_device=worker) == [
        "/job:worker/replica:0/task:1/device:CPU:0",
        "/job:worker/replica:0/task:1/device:CPU:1",
    ]
    other = PipelineOptions(["a"], devices=["/job:worker/task:0/device:CPU:0", "/cpu:1"])
    with pytest.raises(ValueError, match=r"`devices`.*devices of this worker \(worker task 1\)"):
        resolve_devices(other, worker_device=worker)


def test_refuses_sharding():
    refused(
        r"`sharding`. Received: sharding='optimizer'. Expected None with pipeline= under the "
        r"default strategy",
        lambda: tfdist.Trainer(
            mlp, loss=LOSS, sharding="optimizer", pipeline=PipelineOptions(SPLIT)
        ),
    )


def test_refuses_a_global_batch_micro_batches_do_not_divide():
    refused(
        r"`global_batch_size`. Received: global_batch_size=30. Expected a multiple of "
        r"micro_batches=4, e.g. 28 or 32",
        trainer_with(micro_batches=4),
        batch_size=30,
    )


@pytest.mark.parametrize(
    "options, match",
    [
        (dict(split_at=[]), r"`split_at`. Received: split_at=\[\]"),
        (dict(split_at=["a", "a"]), r"`split_at`.*each once"),
        (dict(split_at=["a"], micro_batches=0), r"`micro_batches`. Received: micro_batches=0"),
        (dict(split_at=["a"], devices=["/cpu:0"]), r"`devices`.*a list of 2 device names"),
        (dict(split_at=["a"], allow_batch_norm=1), r"`allow_batch_norm`.*True or False"),
    ],
)
def test_options_are_checked_when_made(options, match):
    with pytest.raises(ValueError, match=match):
        PipelineOptions(**options)


def test_refuses_devices_this_process_does_not_have():
    with pytest.raises(ValueError, match=r"`devices`.*'/device:CPU:9' is not one of them"):
        resolve_devices(PipelineOptions(["a"], devices=["/device:CPU:0", "/device:CPU:9"]))
    # One stage more than the process has CPU devices (an in-process cluster of another test,
    # in the same pytest process, may have added some).
    cpus = len(tf.config.list_logical_devices("CPU"))
    with pytest.raises(ValueError, match=rf"Received: devices=None. Expected {cpus + 1} devices"):
        resolve_devices(PipelineOptions([f"layer_{i}" for i in range(cpus)]))


def test_refuses_a_cut_after_an_input_layer():
    def named_input() -> keras.Model:
        inputs = keras.Input((8,), name="features")
        h = keras.layers.Dense(8, name="d1")(inputs)
        return keras.Model(inputs, keras.layers.Dense(3, name="out")(h))

    refused(
        r"`split_at`.*in its order \(d1\). The first stage would be empty before 'features'",
        trainer_with(named_input, split_at=["features"]),
    )


def test_split_at_auto_needs_a_stage_count_and_enough_places_to_cut():
    with pytest.raises(ValueError, match=r"`stages`. Received: stages=None. Expected an integer"):
        PipelineOptions("auto")
    with pytest.raises(ValueError, match=r"`stages`. Received: stages=3. Expected None or 2"):
        PipelineOptions(["d1"], stages=3)
    refused(
        r"`split_at`. Received: split_at='auto'. Expected a model with at least 4 places to cut "
        r"for stages=5.*only after \['d1', 'd2', 'd3'\]",
        trainer_with(split_at="auto", stages=5),
    )
