"""Bad input, one table: every row gets ONE clear Keras-style error that names the argument.

Each row says how to trigger the bad input and what the message must carry:
the argument's name, the value received (as written in the message) and
fragments of what was expected. Python rows must raise exactly ``ValueError``
(not a TensorFlow error from deep inside, nor a subclass) with a one-line
message; CLI rows (``tfdist.cli`` in-process, as ``app.run`` would call
it) must exit 2 with one ``tfdist CMD: error: Invalid value for argument ...``
line on stderr. ``test_docs_list_every_row`` keeps the table of docs/bad-input.md
and this one the same.

Nothing here trains or starts a process, except one ``python -m tfdist`` run
that checks the real exit path; the one in-process parameter-server cluster is
built only for the row that needs it. Non-loopback addresses are only parsed
and refused (192.0.2.1 is a documentation address); nothing is sent to them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
import types
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.helpers import run_cli_in_process
from tfdist import cluster
from tfdist.launch import local

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BAD_INPUT_PAGE = os.path.join(REPO, "docs", "bad-input.md")
X = np.zeros((64, 8, 8, 1), np.float32)
Y = np.zeros((64,), np.int32)
W = np.ones((64,), np.float32)
LOSS = "sparse_categorical_crossentropy"
EXTERNAL = "192.0.2.1"  # TEST-NET-1 (RFC 5737): parsed and refused, never contacted


def tiny_model() -> keras.Model:
    return tfdist.models.get("mlp", hidden_units=(8,))


def DATASET() -> tf.data.Dataset:  # noqa: N802 (a constant-like maker, beside X and Y)
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(32)


def two_outputs() -> keras.Model:
    inputs = keras.Input((8, 8, 1))
    hidden = keras.layers.Flatten()(inputs)
    outputs = {"cls": keras.layers.Dense(10, name="cls")(hidden)}
    outputs["reg"] = keras.layers.Dense(1, name="reg")(hidden)
    return keras.Model(inputs, outputs)


def with_batch_norm() -> keras.Model:
    inputs = keras.Input((8, 8, 1))
    hidden = keras.layers.Dense(8, name="dense_0")(keras.layers.Flatten()(inputs))
    hidden = keras.layers.BatchNormalization(name="bn")(hidden)
    return keras.Model(inputs, keras.layers.Dense(10, name="logits")(hidden))


class OwnStep(keras.Model):
    def train_step(self, data):
        return super().train_step(data)


def own_train_step() -> keras.Model:
    inputs = keras.Input((8, 8, 1))
    hidden = keras.layers.Dense(8, name="dense_0")(keras.layers.Flatten()(inputs))
    return OwnStep(inputs, keras.layers.Dense(10, name="logits")(hidden))


class Endless(keras.utils.PyDataset):
    """A PyDataset without end (``num_batches`` None)."""

    @property
    def num_batches(self):
        return None

    def __getitem__(self, index):
        return X[:32], Y[:32]


def two_replicas_per_worker() -> tf.distribute.Strategy:
    """A MultiWorkerMirroredStrategy as one of two GPUs per worker looks (no cluster started)."""
    strategy = object.__new__(tf.distribute.MultiWorkerMirroredStrategy)
    strategy._extended = types.SimpleNamespace(worker_devices=("/gpu:0", "/gpu:1"))
    return strategy


@dataclasses.dataclass(frozen=True)
class Case:
    """One row: ``shown`` is the input as a user writes it (docs/bad-input.md's first column)."""

    shown: str
    trigger: Callable[[Env], Any] | list[str]  # a list: CLI arguments after `tfdist`
    name: str
    received: str
    expected: tuple[str, ...]

    @property
    def is_cli(self) -> bool:
        return isinstance(self.trigger, list)


class Env:
    """What a trigger may use; the module fixtures are built only when a row asks for them."""

    def __init__(self, request, tmp_path, monkeypatch):
        self._request, self.tmp_path, self.monkeypatch = request, tmp_path, monkeypatch
        self.a_file = tmp_path / "not_a_dir"
        self.a_file.write_text("a file, not a directory")

    def __getattr__(self, fixture: str) -> Any:  # strategy, trainer, ps_strategy
        return self._request.getfixturevalue(fixture)

    @staticmethod
    def without_gpus() -> None:
        if tf.config.list_physical_devices("GPU"):
            pytest.skip("this row is about a machine without GPUs")

    def trainer_with(self, **kwargs) -> tfdist.Trainer:
        kwargs.setdefault("strategy", self.strategy)
        kwargs.setdefault("loss", LOSS)
        return tfdist.Trainer(kwargs.pop("model", tiny_model), **kwargs)

    def two_output_trainer(self) -> tfdist.Trainer:
        return self.trainer_with(model=two_outputs, loss={"cls": LOSS, "reg": "mse"})

    def broken_backup_fit(self) -> Any:
        (self.tmp_path / "state.json").write_text('{"number": 1')  # cut short
        return self.trainer_with(backup_dir=str(self.tmp_path)).fit(
            (X, Y), global_batch_size=32, verbose=0
        )

    def tf_config(self, config: Any, kind: str = "multi_worker", **options) -> Any:
        self.monkeypatch.setenv(
            "TF_CONFIG", config if isinstance(config, str) else json.dumps(config)
        )
        return tfdist.make_strategy(kind, **options)

    def busy_port_config(self) -> Any:
        """TF_CONFIG naming, as this task's address, a loopback port another socket listens on."""
        sock = socket.socket()
        self._request.addfinalizer(sock.close)
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        return self.tf_config(
            {
                "cluster": {"worker": [f"127.0.0.1:{port}", f"127.0.0.1:{port + 1}"]},
                "task": {"type": "worker", "index": 0},
            }
        )


def _cluster(task_type="worker", index=0, **cluster):
    return {
        "cluster": cluster or {"worker": ["127.0.0.1:2222"]},
        "task": {"type": task_type, "index": index},
    }


PS_CLUSTER = {"chief": ["127.0.0.1:2220"], "worker": ["127.0.0.1:2221"], "ps": ["127.0.0.1:2222"]}

C = Case
CASES = [
    # --- make_strategy ----------------------------------------------------------------------------
    C(
        "make_strategy('mirored')",
        lambda e: tfdist.make_strategy("mirored"),
        "strategy",
        "'mirored'",
        ("one of: auto, mirrored, multi_worker, one_device, parameter_server",),
    ),
    C(
        "make_strategy('mirrored', num_gpus=2)",
        lambda e: tfdist.make_strategy("mirrored", num_gpus=2),
        "num_gpus",
        "2",
        ("an option of strategy 'mirrored': num_devices",),
    ),
    C(
        "make_strategy('mirrored', num_devices=0)",
        lambda e: tfdist.make_strategy("mirrored", num_devices=0),
        "num_devices",
        "0",
        ("a positive integer or None",),
    ),
    C(
        "make_strategy('multi_worker', communication='nccl')  # no GPU",
        lambda e: e.without_gpus() or tfdist.make_strategy("multi_worker", communication="nccl"),
        "communication",
        "'nccl'",
        ("'auto' or 'ring' on a machine without GPUs",),
    ),
    C(
        "make_strategy('multi_worker', communication='mpi')",
        lambda e: tfdist.make_strategy("multi_worker", communication="mpi"),
        "communication",
        "'mpi'",
        ("one of: auto, nccl, ring",),
    ),
    C(
        "make_strategy('one_device', device='/tpu:7')",
        lambda e: tfdist.make_strategy("one_device", device="/tpu:7"),
        "device",
        "'/tpu:7'",
        ("a device of this machine", "/device:CPU:0"),
    ),
    C(
        "make_strategy('parameter_server', num_workers=0)",
        lambda e: tfdist.make_strategy("parameter_server", num_workers=0),
        "num_workers",
        "0",
        ("a positive integer or None",),
    ),
    # --- Trainer(...) -----------------------------------------------------------------------------
    C(
        "Trainer(precision='fp8')",
        lambda e: e.trainer_with(precision="fp8"),
        "precision",
        "'fp8'",
        ("one of: auto, float32, mixed_bfloat16, mixed_float16",),
    ),
    C(
        "Trainer(accumulation_steps=0)",
        lambda e: e.trainer_with(accumulation_steps=0),
        "accumulation_steps",
        "0",
        ("a positive integer",),
    ),
    C(
        "Trainer(steps_per_execution=-1)",
        lambda e: e.trainer_with(steps_per_execution=-1),
        "steps_per_execution",
        "-1",
        ("a positive integer or 'auto'",),
    ),
    C(
        'Trainer(gradient_compression="int8")',
        lambda e: e.trainer_with(gradient_compression="int8"),
        "gradient_compression",
        "'int8'",
        ("one of: bf16, fp16, None",),
    ),
    C(
        "Trainer(bucket_bytes=0)",
        lambda e: e.trainer_with(bucket_bytes=0),
        "bucket_bytes",
        "0",
        ("a positive integer or None",),
    ),
    C(
        'Trainer(sharding="zero")',
        lambda e: e.trainer_with(sharding="zero"),
        "sharding",
        "'zero'",
        ("one of: optimizer, gradients, parameters, None",),
    ),
    C(
        'Trainer(optimizer=Adafactor(), sharding="optimizer")',
        lambda e: e.trainer_with(optimizer=keras.optimizers.Adafactor(), sharding="optimizer"),
        "sharding",
        "'optimizer'",
        ("None with Adafactor", "Use an element-wise optimizer"),
    ),
    C(
        'Trainer(balance="yes")',
        lambda e: e.trainer_with(balance="yes"),
        "balance",
        "'yes'",
        ("True, False or a tfdist.BalanceOptions",),
    ),
    C(
        "Trainer(balance=True)  # mirrored",
        lambda e: e.trainer_with(balance=True),
        "balance",
        "BalanceOptions(window=32, floor=0.25, hysteresis=0.05, min_gain=0.03, splits=None)",
        ("False on this Trainer", "balance splits the global batch between the workers"),
    ),
    C(
        "BalanceOptions(window=0)",
        lambda e: tfdist.BalanceOptions(window=0),
        "BalanceOptions.window",
        "0",
        ("a positive integer",),
    ),
    C(
        "BalanceOptions(floor=1.5)",
        lambda e: tfdist.BalanceOptions(floor=1.5),
        "BalanceOptions.floor",
        "1.5",
        ("a number in [0, 1)",),
    ),
    C(
        "BalanceOptions(splits=[(0, (0, 16))])",
        lambda e: tfdist.BalanceOptions(splits=[(0, (0, 16))]),
        "BalanceOptions.splits",
        "[(0, (0, 16))]",
        ("pairs (update >= 0, (examples per worker, each >= 1, ...))",),
    ),
    C(
        "LocalSGDOptions(sync_every=0)",
        lambda e: tfdist.LocalSGDOptions(sync_every=0),
        "sync_every",
        "0",
        ("a positive integer",),
    ),
    C(
        "LocalSGDOptions(sync_every=4, outer_optimizer='sgd')",
        lambda e: tfdist.LocalSGDOptions(sync_every=4, outer_optimizer="sgd"),
        "outer_optimizer",
        "'sgd'",
        ("a keras.optimizers.Optimizer instance, or None (plain averaging)",),
    ),
    C(
        "Trainer(local_sgd=4)",
        lambda e: e.trainer_with(local_sgd=4),
        "local_sgd",
        "4",
        ("a tfdist.LocalSGDOptions(sync_every=H, outer_optimizer=...) or None",),
    ),
    C(
        "Trainer(local_sgd=LocalSGDOptions(4), sharding='optimizer')",
        lambda e: e.trainer_with(local_sgd=tfdist.LocalSGDOptions(4), sharding="optimizer"),
        "local_sgd",
        "LocalSGDOptions(sync_every=4, outer_optimizer=None, adapt_to_stragglers=False, "
        "fragments=1)",
        ("None with this sharding", "ZeRO keeps one shard of one optimizer state per replica"),
    ),
    C(
        "Trainer(local_sgd=LocalSGDOptions(4), pipeline=PipelineOptions(['dense_0']))",
        lambda e: e.trainer_with(
            strategy=None,
            local_sgd=tfdist.LocalSGDOptions(4),
            pipeline=tfdist.PipelineOptions(["dense_0"]),
        ),
        "local_sgd",
        "LocalSGDOptions(sync_every=4, outer_optimizer=None, adapt_to_stragglers=False, "
        "fragments=1)",
        ("None with this pipeline", "A pipeline's stages"),
    ),
    C(
        "Trainer(local_sgd=LocalSGDOptions(4), balance=True)",
        lambda e: e.trainer_with(local_sgd=tfdist.LocalSGDOptions(4), balance=True),
        "local_sgd",
        "LocalSGDOptions(sync_every=4, outer_optimizer=None, adapt_to_stragglers=False, "
        "fragments=1)",
        ("None with this balance", "under local SGD workers wait for each other only at a sync"),
    ),
    C(
        "Trainer(local_sgd=...)  # a model with its own train_step",
        lambda e: e.trainer_with(model=own_train_step, local_sgd=tfdist.LocalSGDOptions(4)),
        "local_sgd",
        "LocalSGDOptions(sync_every=4, outer_optimizer=None, adapt_to_stragglers=False, "
        "fragments=1)",
        ("None with this model", "has its own train_step"),
    ),
    C(
        "Trainer(pipeline=PipelineOptions(split_at=['dense_1']))",
        lambda e: e.trainer_with(strategy=None, pipeline=tfdist.PipelineOptions(["dense_1"])),
        "split_at",
        "['dense_1']",
        ("names of layers of", "dense_0", "'dense_1' is not one of them"),
    ),
    C(
        "PipelineOptions(split_at=['dense_0'], micro_batches=0)",
        lambda e: tfdist.PipelineOptions(["dense_0"], micro_batches=0),
        "micro_batches",
        "0",
        ("a positive integer",),
    ),
    C(
        "PipelineOptions(split_at=['dense_0'], devices=['/cpu:0'])",
        lambda e: tfdist.PipelineOptions(["dense_0"], devices=["/cpu:0"]),
        "devices",
        "['/cpu:0']",
        ("None or a list of 2 device names, one per stage",),
    ),
    C(
        "Trainer(pipeline=PipelineOptions(..., micro_batches=2))  # BatchNormalization",
        lambda e: e.trainer_with(
            strategy=None,
            model=with_batch_norm,
            pipeline=tfdist.PipelineOptions(["dense_0"], micro_batches=2),
        ),
        "micro_batches",
        "2",
        ("1 for a model with BatchNormalization (bn)", "allow_batch_norm=True"),
    ),
    C(
        "Trainer(pipeline=...)  # a model with its own train_step",
        lambda e: e.trainer_with(
            strategy=None, model=own_train_step, pipeline=tfdist.PipelineOptions(["dense_0"])
        ),
        "pipeline",
        "PipelineOptions(split_at=('dense_0',), micro_batches=1, devices=None, "
        "allow_batch_norm=False, stages=None, schedule='gpipe')",
        ("None for a model with its own train_step",),
    ),
    C(
        "Trainer(strategy=mirrored, pipeline=...)",
        lambda e: e.trainer_with(pipeline=tfdist.PipelineOptions(["dense_0"])),
        "strategy",
        "'MirroredStrategy'",
        ("None (the default strategy: all stages in this process) or a MultiWorkerMirrored",),
    ),
    C(
        "Trainer(strategy=multi_worker, pipeline=...)  # 2 GPUs per worker",
        lambda e: e.trainer_with(
            strategy=two_replicas_per_worker(), pipeline=tfdist.PipelineOptions(["dense_0"])
        ),
        "strategy",
        "'MultiWorkerMirroredStrategy with 2 replicas per worker'",
        ("one replica per worker with pipeline=", 'make_strategy("multi_worker", stage_devices=K)'),
    ),
    C(
        'make_strategy("multi_worker", stage_devices=0)',
        lambda e: tfdist.make_strategy("multi_worker", stage_devices=0),
        "stage_devices",
        "0",
        ("a positive integer",),
    ),
    C(
        "tfdist.stage_tasks()  # no cluster",
        lambda e: e.monkeypatch.delenv("TF_CONFIG", raising=False) or tfdist.stage_tasks(),
        "TF_CONFIG",
        "None",
        ("a cluster of one task per pipeline stage", "tfdist launch --workers=K"),
    ),
    C(
        "tfdist.stage_tasks()  # a cluster with ps tasks",
        lambda e: (
            e.monkeypatch.setenv(
                "TF_CONFIG",
                json.dumps(
                    {
                        "cluster": {"worker": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]},
                        "task": {"type": "worker", "index": 0},
                    }
                ),
            )
            or tfdist.stage_tasks()
        ),
        "TF_CONFIG",
        "'a cluster with ps tasks'",
        ("chief and worker tasks only, one per pipeline stage",),
    ),
    C(
        'Trainer(sharding="optimizer", pipeline=...)  # default strategy',
        lambda e: e.trainer_with(
            strategy=None, sharding="optimizer", pipeline=tfdist.PipelineOptions(["dense_0"])
        ),
        "sharding",
        "'optimizer'",
        ("None with pipeline= under the default strategy",),
    ),
    C(
        "fit(x, y, batch_size=30)  # pipeline, micro_batches=4",
        lambda e: e.trainer_with(
            strategy=None, pipeline=tfdist.PipelineOptions(["dense_0"], micro_batches=4)
        ).fit(X, Y, batch_size=30, verbose=0),
        "global_batch_size",
        "30",
        ("a multiple of micro_batches=4, e.g. 28 or 32",),  # hybrid: x replicas
    ),
    C(
        "Trainer(loss=None).fit(x, y)  # a model without add_loss",
        lambda e: e.trainer_with(loss=None).fit(X, Y, global_batch_size=32, verbose=0),
        "loss",
        "None",
        ("a Keras loss, its name, or a callable",),
    ),
    C(
        "Trainer(loss='crossentropyy')",
        lambda e: e.trainer_with(loss="crossentropyy"),
        "loss",
        "'crossentropyy'",
        ("a Keras loss, its name",),
    ),
    C(
        "Trainer(optimizer='adamm')",
        lambda e: e.trainer_with(optimizer="adamm"),
        "optimizer",
        "'adamm'",
        ("a Keras optimizer or its name, e.g. 'adam'",),
    ),
    C(
        "Trainer('cnn')",
        lambda e: e.trainer_with(model="cnn"),
        "model",
        "'cnn'",
        ("a keras.Model or a zero-arg builder", "tfdist.models.get('cnn')"),
    ),
    C(
        "Trainer(lambda: 3)",
        lambda e: e.trainer_with(model=lambda: 3),
        "model",
        "3",
        ("a builder that returns a keras.Model",),
    ),
    C(
        "Trainer(strategy='mirrored')",
        lambda e: e.trainer_with(strategy="mirrored"),
        "strategy",
        "'mirrored'",
        ("a tf.distribute.Strategy object", "tfdist.make_strategy('mirrored')"),
    ),
    C(
        "Trainer(backup_freq='daily')",
        lambda e: e.trainer_with(backup_freq="daily"),
        "backup_freq",
        "'daily'",
        ("'epoch' or a positive number of optimizer updates",),
    ),
    C(
        "Trainer(backup_dir=<a file>)",
        lambda e: e.trainer_with(backup_dir=str(e.a_file)),
        "backup_dir",
        "'{a_file}'",
        ("a directory, or a path where one can be created", "It is an existing file"),
    ),
    C(
        "Trainer(backup_dir=42)",
        lambda e: e.trainer_with(backup_dir=42),
        "backup_dir",
        "42",
        ("a directory path (str or os.PathLike) or None",),
    ),
    C(
        "Trainer(lr_scaling='sqrt')",
        lambda e: e.trainer_with(lr_scaling="sqrt"),
        "lr_scaling",
        "'sqrt'",
        ("one of: linear, none",),
    ),
    C(
        "Trainer(warmup_steps=10, warmup_epochs=1)",
        lambda e: e.trainer_with(warmup_steps=10, warmup_epochs=1),
        "warmup_epochs",
        "1",
        ("None when warmup_steps is given", "warmup_steps=10"),
    ),
    # --- the Trainer's option objects -------------------------------------------------------------
    C(
        "BackupOptions(dir=None)",
        lambda e: tfdist.BackupOptions(None),
        "dir",
        "None",
        ("a directory path (str or os.PathLike)",),
    ),
    C(
        "BackupOptions('dir', freq=0)",
        lambda e: tfdist.BackupOptions("dir", freq=0),
        "freq",
        "0",
        ("'epoch' or a positive number of optimizer updates",),
    ),
    C(
        "BackupOptions('dir', keep_last=0)",
        lambda e: tfdist.BackupOptions("dir", keep_last=0),
        "keep_last",
        "0",
        ("a positive integer",),
    ),
    C(
        "BackupOptions('dir', keep_after_success='yes')",
        lambda e: tfdist.BackupOptions("dir", keep_after_success="yes"),
        "keep_after_success",
        "'yes'",
        ("True or False",),
    ),
    C(
        "LRScaling('sqrt')",
        lambda e: tfdist.LRScaling("sqrt"),
        "rule",
        "'sqrt'",
        ("one of: linear, none",),
    ),
    C(
        "LRScaling('linear', warmup_steps=-1)",
        lambda e: tfdist.LRScaling("linear", warmup_steps=-1),
        "warmup_steps",
        "-1",
        ("a non-negative integer (optimizer updates)",),
    ),
    C(
        "ExchangeOptions(compression='int8')",
        lambda e: tfdist.ExchangeOptions(compression="int8"),
        "compression",
        "'int8'",
        ("one of: bf16, fp16, None",),
    ),
    C(
        "ExchangeOptions(bucket_bytes=0)",
        lambda e: tfdist.ExchangeOptions(bucket_bytes=0),
        "bucket_bytes",
        "0",
        ("a positive integer or None",),
    ),
    C(
        "ExchangeOptions(sparse='sparse')",
        lambda e: tfdist.ExchangeOptions(sparse="sparse"),
        "sparse",
        "'sparse'",
        ("one of: auto, dense",),
    ),
    C(
        "Trainer(backup=BackupOptions('dir'), backup_freq=5)",
        lambda e: e.trainer_with(backup=tfdist.BackupOptions(str(e.tmp_path)), backup_freq=5),
        "backup_freq",
        "5",
        ("None when `backup` is given",),
    ),
    C(
        "Trainer(backup_freq=50)  # no backup_dir",
        lambda e: e.trainer_with(backup_freq=50),
        "backup_freq",
        "50",
        ("None unless `backup_dir` is given", "Without `backup_dir` it would do nothing"),
    ),
    C(
        "Trainer(backup='dir')",
        lambda e: e.trainer_with(backup="dir"),
        "backup",
        "'dir'",
        ("a tfdist.BackupOptions or None",),
    ),
    # --- Trainer.fit / evaluate -------------------------------------------------------------------
    C(
        "fit(..., epochs=0)",
        lambda e: e.trainer.fit((X, Y), epochs=0),
        "epochs",
        "0",
        ("a positive integer",),
    ),
    C(
        "fit(..., steps_per_epoch=0)",
        lambda e: e.trainer.fit((X, Y), steps_per_epoch=0),
        "steps_per_epoch",
        "0",
        ("a positive integer or None",),
    ),
    C(
        "fit(..., global_batch_size=33)  # 2 replicas",
        lambda e: e.trainer.fit((X, Y), global_batch_size=33),
        "global_batch_size",
        "33",
        ("a positive multiple of the number of replicas in sync (2)", "32 or 34"),
    ),
    C(
        "fit(load('digits'), global_batch_size=4096)",
        lambda e: e.trainer.fit(tfdist.data.load("digits"), global_batch_size=4096),
        "global_batch_size",
        "4096",
        ("at most the 1437 examples of 'digits' split 'train'",),
    ),
    C(
        "fit({'x': x})  # no y",
        lambda e: e.trainer.fit({"x": X}, global_batch_size=32),
        "y",
        "None",
        ("the targets for the arrays x",),
    ),
    C(
        "fit('digits')",
        lambda e: e.trainer.fit("digits", global_batch_size=32),
        "x",
        "'digits'",
        ("a tfdist.data.DatasetFn", "pass tfdist.data.load('digits')"),
    ),
    C(
        "fit((x[:64], y[:10]))",
        lambda e: e.trainer.fit((X, Y[:10]), global_batch_size=32),
        "x",
        "((64, 8, 8, 1), (10,))",
        ("arrays with the same first dimension",),
    ),
    C(
        "fit((np.zeros((64, 5)), y))  # model input (8, 8, 1)",
        lambda e: e.trainer.fit((np.zeros((64, 5), np.float32), Y), global_batch_size=32),
        "x",
        "'batches of x with shape (None, 5)'",
        ("x of shape (None, 8, 8, 1), the input shape of model 'mlp'",),
    ),
    C(
        "fit(unbatched dataset_fn)  # no global_batch_size",
        lambda e: e.trainer.fit(lambda ctx: tf.data.Dataset.range(4)),
        "global_batch_size",
        "None",
        ("a positive integer", "`x` yields unbatched elements"),
    ),
    C(
        "fit(..., verbose='loud')",
        lambda e: e.trainer.fit((X, Y), global_batch_size=32, verbose="loud"),
        "verbose",
        "'loud'",
        ("'auto', 0, 1 or 2",),
    ),
    C(
        "fit(..., callbacks='tensorboard')",
        lambda e: e.trainer.fit((X, Y), callbacks="tensorboard"),
        "callbacks",
        "'tensorboard'",
        ("a list of keras.callbacks.Callback",),
    ),
    C(
        "fit(..., callbacks=[ReduceLROnPlateau()])  # Trainer(lr_scaling='linear')",
        lambda e: e.trainer_with(lr_scaling="linear").fit(
            (X, Y), callbacks=[keras.callbacks.ReduceLROnPlateau()]
        ),
        "callbacks",
        "['ReduceLROnPlateau']",
        ("no callback that sets the learning rate", "lr_scaling='linear'"),
    ),
    C(
        "fit(..., callbacks=[keras.callbacks.BackupAndRestore(d)])  # Trainer(backup=...)",
        lambda e: e.trainer_with(backup_dir=str(e.tmp_path)).fit(
            (X, Y), callbacks=[keras.callbacks.BackupAndRestore(str(e.tmp_path))]
        ),
        "callbacks",
        "['BackupAndRestore']",
        ("no BackupAndRestore when the Trainer has `backup`",),
    ),
    C(
        "fit(..., callbacks=[OrbaxCheckpoint(d)])",
        lambda e: e.trainer.fit(
            (X, Y), callbacks=[object.__new__(keras.callbacks.OrbaxCheckpoint)]
        ),
        "callbacks",
        "'OrbaxCheckpoint'",
        ("callbacks that tfdist.Trainer supports",),
    ),
    C(
        "fit(..., validation_steps=0)",
        lambda e: e.trainer.fit((X, Y), validation_data=(X, Y), validation_steps=0),
        "validation_steps",
        "0",
        ("a positive integer or None",),
    ),
    C(
        "fit(..., initial_epoch=-1)",
        lambda e: e.trainer.fit((X, Y), initial_epoch=-1),
        "initial_epoch",
        "-1",
        ("a non-negative integer",),
    ),
    C(
        "fit()  # no x",
        lambda e: e.trainer.fit(),
        "x",
        "None",
        ("the inputs: arrays, a dataset or a dataset_fn",),
    ),
    C(
        "fit(x, y, batch_size=32, global_batch_size=64)",
        lambda e: e.trainer.fit(X, Y, batch_size=32, global_batch_size=64),
        "batch_size",
        "32",
        ("None or global_batch_size's value (64)", "the same thing"),
    ),
    C(
        "fit(x, y, steps_per_epoch=5)  # 64 examples, 2 replicas",
        lambda e: e.trainer.fit(X, Y, steps_per_epoch=5),
        "batch_size",
        "None",
        ("a multiple of the 2 replicas in sync", "ceil(64 / 5) = 13"),
    ),
    C(
        "fit(dataset, y)",
        lambda e: e.trainer.fit(DATASET(), Y),
        "y",
        "'ndarray'",
        ("None when x is a tf.data.Dataset", "Its elements carry the targets"),
    ),
    C(
        "fit(dataset, sample_weight=w)",
        lambda e: e.trainer.fit(DATASET(), sample_weight=W),
        "sample_weight",
        "'ndarray'",
        ("None when x is a tf.data.Dataset",),
    ),
    C(
        "fit(dataset, validation_split=0.25)",
        lambda e: e.trainer.fit(DATASET(), validation_split=0.25),
        "validation_split",
        "0.25",
        ("0.0 when x is a tf.data.Dataset", "pass validation_data instead"),
    ),
    C(
        "fit(x, y, validation_split=0.25, validation_data=(x, y))",
        lambda e: e.trainer.fit(X, Y, validation_split=0.25, validation_data=(X, Y)),
        "validation_split",
        "0.25",
        ("0.0 when validation_data is given", "Keras would use validation_data"),
    ),
    C(
        "fit(x, y, validation_split=1.5)",
        lambda e: e.trainer.fit(X, Y, validation_split=1.5),
        "validation_split",
        "1.5",
        ("a number in [0, 1)",),
    ),
    C(
        "fit(x[:2], y[:2], validation_split=0.6)",
        lambda e: e.trainer.fit(X[:2], Y[:2], validation_split=0.6),
        "validation_split",
        "0.6",
        ("a fraction that leaves both parts of the 2 examples non-empty",),
    ),
    C(
        "fit(..., validation_freq=0)",
        lambda e: e.trainer.fit(X, Y, validation_data=(X, Y), validation_freq=0),
        "validation_freq",
        "0",
        ("a positive integer, or a list of epochs (1-based)",),
    ),
    C(
        "fit(..., validation_data=dataset, validation_batch_size=16)",
        lambda e: e.trainer.fit(X, Y, validation_data=DATASET(), validation_batch_size=16),
        "validation_batch_size",
        "16",
        ("None when validation_data is a tf.data.Dataset", "It is batched already"),
    ),
    C(
        "fit(..., shuffle='yes')",
        lambda e: e.trainer.fit(X, Y, shuffle="yes"),
        "shuffle",
        "'yes'",
        ("True, False or 'batch'",),
    ),
    C(
        "fit(load('digits'), shuffle=False)",
        lambda e: e.trainer.fit(tfdist.data.load("digits"), shuffle=False, global_batch_size=32),
        "shuffle",
        "False",
        ("True when x is a tfdist.data.DatasetFn", "It shuffles its training batches itself"),
    ),
    C(
        "fit(x, y, class_weight={-1: 2.0})",
        lambda e: e.trainer.fit(X, Y, class_weight={-1: 2.0}),
        "class_weight",
        "{-1: 2.0}",
        ("class indices (non-negative ints) as keys", "Key -1 is not one"),
    ),
    C(
        "fit(x, y, class_weight={0: 1.0, 10: 2.0})  # 10 classes",
        lambda e: e.trainer.fit(X, Y, class_weight={0: 1.0, 10: 2.0}),
        "class_weight",
        "{0: 1.0, 10: 2.0}",
        ("keys that are classes of the model's output, 0 to 9", "No class 10"),
    ),
    C(
        "fit(x, y, class_weight={0: 2.0}, sample_weight=w)",
        lambda e: e.trainer.fit(X, Y, class_weight={0: 2.0}, sample_weight=W),
        "class_weight",
        "{0: 2.0}",
        ("None for data with sample weights", "Keras refuses both"),
    ),
    C(
        "fit(x, {'cls': y, 'reg': y}, class_weight={0: 2.0})  # 2 outputs",
        lambda e: e.two_output_trainer().fit(
            X, {"cls": Y, "reg": Y.astype("float32")}, class_weight={0: 2.0}
        ),
        "class_weight",
        "{0: 2.0}",
        ("None for a model with several outputs", "pass sample_weight per output"),
    ),
    C(
        "evaluate(..., steps=0)",
        lambda e: e.trainer.evaluate((X, Y), steps=0),
        "steps",
        "0",
        ("a positive integer or None",),
    ),
    C(
        "evaluate(x, y, callbacks=History())",
        lambda e: e.trainer.evaluate(X, Y, callbacks=keras.callbacks.History()),
        "callbacks",
        "<keras.src.callbacks.history.History",
        ("a list of keras.callbacks.Callback",),
    ),
    C(
        "evaluate(x, y, return_dict='yes')",
        lambda e: e.trainer.evaluate(X, Y, return_dict="yes"),
        "return_dict",
        "'yes'",
        ("True or False",),
    ),
    C(
        "predict(x, batch_size=8, global_batch_size=16)",
        lambda e: e.trainer.predict(X, batch_size=8, global_batch_size=16),
        "batch_size",
        "8",
        ("None or global_batch_size's value (16)",),
    ),
    C(
        "evaluate(load('digits'), global_batch_size=33)  # 2 replicas",
        lambda e: e.trainer.evaluate(tfdist.data.load("digits"), global_batch_size=33),
        "global_batch_size",
        "33",
        (
            "a positive multiple of the number of replicas in sync (2)",
            "evaluate and predict take any batch size from arrays or a tf.data.Dataset",
        ),
    ),
    # --- data and models --------------------------------------------------------------------------
    C(
        "data.load('imagenet')",
        lambda e: tfdist.data.load("imagenet"),
        "dataset",
        "'imagenet'",
        ("one of: digits, patterns, python_source, synthetic, tfds:NAME",),
    ),
    C(
        "data.load('digits', split='trian')",
        lambda e: tfdist.data.load("digits", split="trian"),
        "split",
        "'trian'",
        ("one of: train, validation, test, all",),
    ),
    C(
        "data.load('digits', num_examples=5)",
        lambda e: tfdist.data.load("digits", num_examples=5),
        "num_examples",
        "5",
        ("an option of dataset 'digits': it takes none",),
    ),
    C(
        "data.load('tfds:mnist', data_dir=<empty dir>)",
        lambda e: tfdist.data.load("tfds:mnist", data_dir=str(e.tmp_path)),
        "data_dir",
        "'{tmp_path}'",
        ("a directory holding the prepared TFDS dataset 'mnist'", "tfds build mnist"),
    ),
    C(
        "data.load('digits')(input_context)  # unbound",
        lambda e: tfdist.data.load("digits")(None),
        "global_batch_size",
        "None",
        ("a positive integer", "call .bind(global_batch_size=...) first"),
    ),
    C(
        "data.load('python_source', split='trian')",
        lambda e: tfdist.data.load("python_source", split="trian"),
        "split",
        "'trian'",
        ("one of: train, validation, test",),
    ),
    C(
        "data.load('python_source', seq_len=0)",
        lambda e: tfdist.data.load("python_source", seq_len=0),
        "seq_len",
        "0",
        ("a positive integer",),
    ),
    C(
        "data.load('python_source', max_bytes=100)  # seq_len=128",
        lambda e: tfdist.data.load("python_source", max_bytes=100),
        "max_bytes",
        "100",
        ("None (all the text) or an int of at least seq_len + 1 (129) bytes",),
    ),
    C(
        "models.get('vgg')",
        lambda e: tfdist.models.get("vgg"),
        "model",
        "'vgg'",
        ("one of: cnn, convnet, gpt, mlp, resnet, transformer",),
    ),
    C(
        "models.get('gpt', input_shape=(128,), width=100, heads=3)",
        lambda e: tfdist.models.get("gpt", input_shape=(128,), width=100, heads=3),
        "width",
        "100",
        ("a multiple of heads (3)",),
    ),
    C(
        "models.get('mlp', num_blocks=3)",
        lambda e: tfdist.models.get("mlp", num_blocks=3),
        "num_blocks",
        "3",
        ("an option of model 'mlp': hidden_units, dropout",),
    ),
    C(
        "models.get('mlp', hidden_units=-1)",
        lambda e: tfdist.models.get("mlp", hidden_units=-1),
        "hidden_units",
        "-1",
        ("a sequence of positive ints, e.g. (256, 256)",),
    ),
    C(
        "models.get('cnn', dropout=1.5)",
        lambda e: tfdist.models.get("cnn", dropout=1.5),
        "dropout",
        "1.5",
        ("a number in [0, 1)",),
    ),
    C(
        "models.get('transformer', d_model=30)",
        lambda e: tfdist.models.get("transformer", d_model=30),
        "d_model",
        "30",
        ("a multiple of num_heads (4)",),
    ),
    C(
        "models.get('cnn', input_shape=(64,))",
        lambda e: tfdist.models.get("cnn", input_shape=(64,)),
        "input_shape",
        "(64,)",
        ("(height, width, channels) for model 'cnn'",),
    ),
    # --- TF_CONFIG and Slurm (read by make_strategy) ----------------------------------------------
    C(
        "TF_CONFIG='{cluster:'",
        lambda e: e.tf_config("{cluster:"),
        "TF_CONFIG",
        "'{cluster:'",
        ("a JSON object", "line 1 column 2"),
    ),
    C(
        "TF_CONFIG without cluster",
        lambda e: e.tf_config({"task": {"type": "worker", "index": 0}}),
        "TF_CONFIG.cluster",
        "<missing>",
        ("a non-empty dict mapping task types to lists of 'host:port'",),
    ),
    C(
        "TF_CONFIG without task",
        lambda e: e.tf_config({"cluster": {"worker": ["127.0.0.1:2222"]}}),
        "TF_CONFIG.task",
        "<missing>",
        ("a dict like {'type': 'worker', 'index': 0}",),
    ),
    C(
        "TF_CONFIG worker address '127.0.0.1'",
        lambda e: e.tf_config(_cluster(worker=["127.0.0.1"])),
        "TF_CONFIG.cluster.worker[0]",
        "'127.0.0.1'",
        ("a 'host:port' string with an integer port in 1..65535",),
    ),
    C(
        "TF_CONFIG cluster task type 'wrker'",
        lambda e: e.tf_config(_cluster("wrker", wrker=["127.0.0.1:1"])),
        "TF_CONFIG.cluster",
        "{'wrker': ['127.0.0.1:1']}",
        ("task types from: chief, worker, ps, evaluator", "Unknown task type(s): wrker"),
    ),
    C(
        "TF_CONFIG task type 'ps' not in cluster",
        lambda e: e.tf_config(_cluster("ps")),
        "TF_CONFIG.task.type",
        "'ps'",
        ("one of: worker", "one of the task types in TF_CONFIG.cluster"),
    ),
    C(
        "TF_CONFIG task index 3 of 1",
        lambda e: e.tf_config(_cluster(index=3)),
        "TF_CONFIG.task.index",
        "3",
        ("an integer in the range [0, 0]",),
    ),
    C(
        "TF_CONFIG duplicate address",
        lambda e: e.tf_config(_cluster(worker=["127.0.0.1:2222", "127.0.0.1:2222"])),
        "TF_CONFIG.cluster.worker[1]",
        "'127.0.0.1:2222'",
        ("an address used by exactly one task", "worker[0] has the same address"),
    ),
    C(
        "TF_CONFIG own port in use",
        lambda e: e.busy_port_config(),
        "TF_CONFIG.cluster.worker[0]",
        "'127.0.0.1:",
        ("a free port", "already in use"),
    ),
    C(
        "TF_CONFIG with ps, strategy 'multi_worker'",
        lambda e: e.tf_config({**_cluster("chief"), "cluster": PS_CLUSTER}),
        "strategy",
        "'multi_worker'",
        ("'parameter_server' for a cluster with ps tasks",),
    ),
    C(
        "TF_CONFIG without ps, strategy 'parameter_server'",
        lambda e: e.tf_config(_cluster(), kind="parameter_server"),
        "TF_CONFIG.cluster",
        "['worker']",
        ("a cluster with ps tasks", "strategy='multi_worker'"),
    ),
    C(
        "TF_CONFIG and make_strategy('parameter_server', num_workers=2)",
        lambda e: e.tf_config(
            {**_cluster("chief"), "cluster": PS_CLUSTER}, kind="parameter_server", num_workers=2
        ),
        "num_workers",
        "2",
        ("None when TF_CONFIG describes the cluster",),
    ),
    C(
        "SLURM_JOB_NODELIST='node[01-03'",
        lambda e: cluster.from_environment(
            {
                "SLURM_JOB_ID": "7",
                "SLURM_STEP_ID": "0",
                "SLURM_PROCID": "0",
                "SLURM_JOB_NODELIST": "node[01-03",
                "SLURM_NTASKS": "3",
            }
        ),
        "SLURM_JOB_NODELIST",
        "'node[01-03'",
        ("a Slurm host list like 'node[01-03,07],other'",),
    ),
    # --- launcher (Python API) --------------------------------------------------------------------
    C(
        "launch('python train.py', workers=2)",
        lambda e: local.launch("python train.py", workers=2),
        "command",
        "'python train.py'",
        ("a non-empty list of strings",),
    ),
    C(
        "launch([...], workers=2, max_restarts=-1)",
        lambda e: local.launch(["true"], workers=2, max_restarts=-1),
        "max_restarts",
        "-1",
        ("a non-negative integer",),
    ),
    C(
        "launch([...], workers=1, ports=[2222, 2223])",
        lambda e: local.launch(["true"], workers=1, ports=[2222, 2223]),
        "ports",
        "[2222, 2223]",
        ("1 port (one per task: 1 worker)",),
    ),
    # --- backups ----------------------------------------------------------------------------------
    C(
        "Trainer(backup_dir=<dir with a broken state.json>).fit(...)",
        lambda e: e.broken_backup_fit(),
        "backup_dir",
        "'{tmp_path}'",
        ("a directory holding a tfdist backup, or none", "state.json is not a backup"),
    ),
    C(
        "BackupAndRestore(dir, save_freq=0)",
        lambda e: tfdist.callbacks.BackupAndRestore(str(e.tmp_path), save_freq=0),
        "save_freq",
        "0",
        ("'epoch' or a positive number of batches",),
    ),
    C(
        "BackupAndRestore(<a file>)",
        lambda e: tfdist.callbacks.BackupAndRestore(str(e.a_file)),
        "backup_dir",
        "'{a_file}'",
        ("a directory, or a path where one can be created",),
    ),
    C(
        "BackupAndRestore(None)",
        lambda e: tfdist.callbacks.BackupAndRestore(None),
        "backup_dir",
        "None",
        ("a directory path (str or os.PathLike).",),
    ),
    # --- command line -----------------------------------------------------------------------------
    C(
        "tfdist train --strategy=mirored",
        ["train", "--strategy=mirored"],
        "strategy",
        "'mirored'",
        ("one of: auto, mirrored, multi_worker",),
    ),
    C(
        "tfdist train --precision=fp8",
        ["train", "--precision=fp8"],
        "precision",
        "'fp8'",
        ("one of: auto, float32, mixed_bfloat16, mixed_float16",),
    ),
    C(
        "tfdist train --sharding=zero",
        ["train", "--sharding=zero"],
        "sharding",
        "'zero'",
        ("one of: gradients, off, optimizer",),
    ),
    C(
        "tfdist train --balance=maybe",
        ["train", "--strategy=multi_worker", "--balance=maybe"],
        "balance",
        "'maybe'",
        ("'off', 'on', or key=value pairs of: window, floor, hysteresis, min_gain",),
    ),
    C(
        "tfdist train --balance=on  # mirrored",
        ["train", "--balance=on"],
        "balance",
        "'on'",
        ("off with --strategy=mirrored --pipeline=off", "workers of --strategy=multi_worker"),
    ),
    C(
        "tfdist train --local_sgd=outer=nesterov",
        ["train", "--local_sgd=outer=nesterov"],
        "local_sgd",
        "'outer=nesterov'",
        ("sync_every=H with H a positive integer",),
    ),
    C(
        "tfdist train --local_sgd=sync_every=4,outer=adam",
        ["train", "--local_sgd=sync_every=4,outer=adam"],
        "local_sgd",
        "'sync_every=4,outer=adam'",
        ("outer= one of none, sgd, nesterov",),
    ),
    C(
        "tfdist train --local_sgd=sync_every=4,outer_momentum=0.9",
        ["train", "--local_sgd=sync_every=4,outer_momentum=0.9"],
        "local_sgd",
        "'sync_every=4,outer_momentum=0.9'",
        ("outer=sgd or outer=nesterov with outer_learning_rate or outer_momentum",),
    ),
    C(
        "tfdist train --local_sgd=sync_every=4 --sharding=optimizer",
        ["train", "--local_sgd=sync_every=4", "--sharding=optimizer"],
        "local_sgd",
        "'sync_every=4'",
        ("off with --sharding",),
    ),
    C(
        "tfdist train --global_batch_size=0",
        ["train", "--global_batch_size=0"],
        "global_batch_size",
        "0",
        ("a positive integer",),
    ),
    C(
        "tfdist train --steps_per_execution=0",
        ["train", "--steps_per_execution=0"],
        "steps_per_execution",
        "0",
        ("a positive integer or 'auto'",),
    ),
    C(
        "tfdist train --steps_per_execution=fast",
        ["train", "--steps_per_execution=fast"],
        "steps_per_execution",
        "'fast'",
        ("a positive integer or 'auto'",),
    ),
    C(
        "tfdist train --epochs=five",
        ["train", "--epochs=five"],
        "epochs",
        "'five'",
        ("an integer",),
    ),
    C(
        "tfdist train --stratgy=mirrored",
        ["train", "--stratgy=mirrored"],
        "flag",
        "'--stratgy=mirrored'",
        ("a flag of `tfdist train`", "Did you mean --strategy?"),
    ),
    C(
        "tfdist train --model_dir=<a file>",
        ["train", "--model_dir={a_file}"],
        "model_dir",
        "'{a_file}'",
        ("a directory, or a path where one can be created",),
    ),
    C(
        "tfdist train --strategy=parameter_server  # no --steps_per_epoch",
        ["train", "--strategy=parameter_server"],
        "steps_per_epoch",
        "None",
        ("a positive integer with --strategy=parameter_server", "--steps_per_epoch=25"),
    ),
    C(
        "tfdist train --pipeline=split_at=conv_1 --strategy=mirrored",
        ["train", "--pipeline=split_at=conv_1", "--strategy=mirrored"],
        "strategy",
        "'mirrored'",
        ("no --strategy with --pipeline", "TensorFlow's default strategy"),
    ),
    C(
        "tfdist train --pipeline=split_at=conv_1,micro=4",
        ["train", "--pipeline=split_at=conv_1,micro=4"],
        "pipeline",
        "'split_at=conv_1,micro=4'",
        ("'off' or key=value pairs of: split_at, micro_batches, devices, allow_batch_norm",),
    ),
    C(
        "tfdist train --pipeline=split_at=conv_9  # the cnn has no conv_9",
        ["train", "--pipeline=split_at=conv_9", "--epochs=1", "--verbose=0"],
        "split_at",
        "['conv_9']",
        ("names of layers of 'cnn': inputs, conv_0, conv_1, pool",),
    ),
    C(
        "tfdist train extra",
        ["train", "extra"],
        "args",
        "['extra']",
        ("no positional arguments for `tfdist train`",),
    ),
    C("tfdist fly", ["fly"], "command", "'fly'", ("one of: train, launch, bench, manifest",)),
    C(
        "tfdist bench --benchmarks=scalin",
        ["bench", "--benchmarks=scalin"],
        "benchmarks",
        "'scalin'",
        ("one of: accumulation, allreduce, backup",),
    ),
    C(
        "tfdist bench --benchmarks=time_to_accuracy --time_to_accuracy_tasks=digits,imagenet",
        ["bench", "--benchmarks=time_to_accuracy", "--time_to_accuracy_tasks=digits,imagenet"],
        "time_to_accuracy_tasks",
        "'digits,imagenet'",
        ("one or more of: digits, patterns, comma-separated", "Unknown: 'imagenet'"),
    ),
    C(
        "tfdist launch --workers=2  # no command",
        ["launch", "--workers=2"],
        "command",
        "[]",
        ("a command after --", "tfdist launch --workers=2 -- tfdist train"),
    ),
    C(
        "tfdist launch --workers=0 -- CMD",
        ["launch", "--workers=0", "--", "true"],
        "workers",
        "0",
        ("a positive integer",),
    ),
    C(
        f"tfdist launch --host={EXTERNAL} -- CMD",
        ["launch", f"--host={EXTERNAL}", "--", "true"],
        "host",
        f"'{EXTERNAL}'",
        ("a loopback address", "unauthenticated", "--allow_external"),
    ),
    C(
        "tfdist launch --nnodes=2 --hosts=127.0.0.1 -- CMD",
        ["launch", "--nnodes=2", "--hosts=127.0.0.1", "--", "true"],
        "hosts",
        "['127.0.0.1']",
        ("2 'host:port' entries, one per node", "It has 1"),
    ),
    C(
        "tfdist launch --nnodes=2 --hosts=127.0.0.1:2222,nohost -- CMD",
        ["launch", "--nnodes=2", "--hosts=127.0.0.1:2222,nohost", "--", "true"],
        "hosts[1]",
        "'nohost'",
        ("a 'host:port' string with an integer port",),
    ),
    C(
        "tfdist launch --nnodes=2 --node_rank=2 --hosts=... -- CMD",
        [
            "launch",
            "--nnodes=2",
            "--node_rank=2",
            "--hosts=127.0.0.1:2222,127.0.0.1:2232",
            "--",
            "true",
        ],
        "node_rank",
        "2",
        ("an integer in the range [0, 1]",),
    ),
    C(
        "tfdist launch --max_restarts=-1 -- CMD",
        ["launch", "--max_restarts=-1", "--", "true"],
        "max_restarts",
        "-1",
        ("a non-negative integer",),
    ),
    C(
        "tfdist manifest unknownkind",
        ["manifest", "unknownkind", "--", "true"],
        "manifest",
        "'unknownkind'",
        ("one of: kubernetes, slurm",),
    ),
    C(
        "tfdist manifest slurm  # no command",
        ["manifest", "slurm"],
        "command",
        "[]",
        ("a command after --", "tfdist manifest slurm --workers=2 -- tfdist train"),
    ),
    C(
        "tfdist manifest slurm --ps=1 -- CMD",
        ["manifest", "slurm", "--ps=1", "--", "true"],
        "ps",
        "1",
        ("0 without a chief", "add --chief"),
    ),
    C(
        "tfdist manifest kubernetes --nnodes=2 -- CMD",
        ["manifest", "kubernetes", "--nnodes=2", "--", "true"],
        "nnodes",
        "2",
        ("no --nnodes for `tfdist manifest kubernetes`",),
    ),
    C(
        "tfdist launch --epochs=3 -- CMD",
        ["launch", "--epochs=3", "--", "true"],
        "epochs",
        "3",
        ("no --epochs for `tfdist launch`", "--epochs is a flag of `tfdist train`"),
    ),
    C(
        "tfdist train --cpus_per_worker=2",
        ["train", "--cpus_per_worker=2"],
        "cpus_per_worker",
        "2.0",
        ("no --cpus_per_worker without --engine=ray",),
    ),
    C(
        "tfdist manifest kubernetes -- CMD  # no --image",
        ["manifest", "kubernetes", "--", "true"],
        "image",
        "None",
        ("a container image reference",),
    ),
    C(
        "fit(generator_of_arrays)  # not (x, y) tuples",
        lambda e: e.trainer.fit(x for x in [X, X]),
        "x",
        "'a generator yielding ndarray'",
        ("a generator of (x,), (x, y) or (x, y, sample_weight) tuples",),
    ),
    C(
        "fit(endless_py_dataset)  # no steps_per_epoch",
        lambda e: e.trainer.fit(Endless()),
        "steps_per_epoch",
        "None",
        ("a positive integer", "never ends"),
    ),
    C(
        "fit(dataset.filter(f).batch(32))  # accumulation_steps=2, no steps_per_epoch",
        lambda e: e.trainer_with(accumulation_steps=2).fit(
            tf.data.Dataset.from_tensor_slices((X, Y)).filter(lambda x, y: y >= 0).batch(32)
        ),
        "steps_per_epoch",
        "None",
        ("a positive integer with accumulation_steps=2",),
    ),
    # --- last: building the in-process PS cluster points TF's eager context at it, so strategies
    # --- (and the shared mirrored one) made before no longer find their devices.
    C(
        "fit(...)  # parameter_server, no steps_per_epoch",
        lambda e: e.trainer_with(strategy=e.ps_strategy).fit((X, Y), global_batch_size=32),
        "steps_per_epoch",
        "None",
        ("a positive integer under strategy 'parameter_server'",),
    ),
    C(
        'Trainer(sharding="optimizer")  # parameter_server',
        lambda e: e.trainer_with(strategy=e.ps_strategy, sharding="optimizer"),
        "sharding",
        "'optimizer'",
        ("None on this strategy", "parameter_server keeps each variable and its state once"),
    ),
    C(
        "Trainer(local_sgd=LocalSGDOptions(4))  # parameter_server",
        lambda e: e.trainer_with(strategy=e.ps_strategy, local_sgd=tfdist.LocalSGDOptions(4)),
        "local_sgd",
        "LocalSGDOptions(sync_every=4, outer_optimizer=None, adapt_to_stragglers=False, "
        "fragments=1)",
        ("None on this strategy", "there are no per-worker parameters to average"),
    ),
    C(
        "Trainer(balance=True)  # parameter_server",
        lambda e: e.trainer_with(strategy=e.ps_strategy, balance=True),
        "balance",
        "BalanceOptions(window=32, floor=0.25, hysteresis=0.05, min_gain=0.03, splits=None)",
        ("False on this Trainer", "parameter_server balances by nature"),
    ),
    C(
        "Trainer(pipeline=...)  # parameter_server",
        lambda e: e.trainer_with(
            strategy=e.ps_strategy, pipeline=tfdist.PipelineOptions(["dense_0"])
        ),
        "strategy",
        "'ParameterServerStrategyV2'",
        ("None (the default strategy: all stages in this process) or a MultiWorkerMirrored",),
    ),
    C(
        "fit(generator, steps_per_epoch=2)  # parameter_server",
        lambda e: e.trainer_with(strategy=e.ps_strategy).fit(
            (b for b in [(X, Y)] * 4), steps_per_epoch=2, verbose=0
        ),
        "x",
        "'a Python generator or keras.utils.PyDataset'",
        ("a tf.data.Dataset, a dataset_fn or arrays under strategy 'parameter_server'",),
    ),
]
assert len({c.shown for c in CASES}) == len(CASES)


@pytest.fixture(scope="module")
def strategy():
    return tfdist.make_strategy("mirrored", num_devices=2)


@pytest.fixture(scope="module")
def trainer(strategy):
    return tfdist.Trainer(tiny_model, strategy=strategy, loss=LOSS)


@pytest.fixture(scope="module")
def ps_strategy():
    # This file's only in-process parameter-server cluster (its servers live as long as pytest).
    return tfdist.make_strategy(
        "parameter_server", num_workers=1, num_ps=1, allow_late_connect=True
    )


def _ids(case: Case) -> str:
    return re.sub(r"[^A-Za-z0-9_=.-]+", "_", case.shown).strip("_")[:60]


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_bad_input(case, request, tmp_path, monkeypatch, capsys):
    env = Env(request, tmp_path, monkeypatch)
    monkeypatch.delenv("TF_CONFIG", raising=False)

    def fill(text: str) -> str:  # the paths a row names before they exist
        return text.replace("{a_file}", str(env.a_file)).replace("{tmp_path}", str(tmp_path))

    if case.is_cli:
        command = (
            case.trigger[0] if case.trigger[0] in ("train", "launch", "bench", "manifest") else ""
        )
        code, err = run_cli_in_process([fill(a) for a in case.trigger], capsys)
        assert code == 2, err
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        prefix = f"tfdist {command}: error: " if command else "tfdist: error: "
        assert lines[0].startswith(prefix + "Invalid value for argument"), err
        message = lines[0][len(prefix) :]
    else:
        with pytest.raises(Exception) as info:
            case.trigger(env)
        assert type(info.value) is ValueError, f"{type(info.value).__name__}: {info.value}"
        message = str(info.value)
        assert "\n" not in message, message
    received = fill(case.received)
    assert message.startswith(
        f"Invalid value for argument `{case.name}`. Received: {case.name}={received}"
    ), message
    for fragment in case.expected:
        assert fill(fragment) in message.split(". Expected ", 1)[1], message


def test_cli_bad_flag_exits_2_with_one_line():
    """The real ``python -m tfdist`` path: exit code 2 and one error line, no traceback."""
    env = {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    env.pop("TF_CONFIG", None)
    proc = subprocess.run(
        [sys.executable, "-m", "tfdist", "train", "--strategy=mirored"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    ours = [line for line in proc.stderr.splitlines() if line.startswith("tfdist")]
    assert ours == [
        "tfdist train: error: Invalid value for argument `strategy`. Received: strategy='mirored'. "
        "Expected one of: auto, mirrored, multi_worker, one_device, parameter_server."
    ], proc.stderr
    assert proc.stderr.rstrip().endswith(ours[0])
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_docs_list_every_row():
    """The table of docs/bad-input.md has one row per case, in the same order."""
    with open(BAD_INPUT_PAGE) as f:
        table = f.read().split("\n| input | error (abbreviated) |\n", 1)[1]
    section = table.split("\n\n", 1)[0]
    shown = [
        row.split("|")[1].strip().strip("`")
        for row in section.splitlines()
        if row.startswith("| `")
    ]
    assert shown == [c.shown for c in CASES]
