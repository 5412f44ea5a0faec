"""The Trainer's option groups (objects and flat shortcuts mean the same); logs as floats."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.jobs.common import builder, data, initial_weights
from tfdist.logs import as_floats

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _trainer(**kwargs):
    return tfdist.Trainer(
        builder(), strategy=tfdist.make_strategy("one_device"), loss=LOSS, **kwargs
    )


def test_shortcuts_build_the_option_objects(tmp_path):
    flat = _trainer(
        backup_dir=str(tmp_path),
        backup_freq=3,
        keep_backups=2,
        keep_backup=True,
        lr_scaling="linear",
        base_global_batch_size=16,
        warmup_steps=5,
        gradient_compression="bf16",
        bucket_bytes=100,
    )
    assert flat.backup == tfdist.BackupOptions(
        str(tmp_path), freq=3, keep_last=2, keep_after_success=True
    )
    assert flat.lr_scaling == tfdist.LRScaling("linear", base_global_batch_size=16, warmup_steps=5)
    assert flat.exchange == tfdist.ExchangeOptions(compression="bf16", bucket_bytes=100)
    plain = _trainer()
    assert plain.backup is None and plain.exchange == tfdist.ExchangeOptions()
    assert plain.lr_scaling == tfdist.LRScaling("none") and not plain.lr_scaling.active
    assert plain.learning_rate_schedule is None


def test_the_trainer_holds_its_options_in_one_frozen_bundle(tmp_path):
    from tfdist.training.options import TrainerOptions

    trainer = _trainer(backup_dir=str(tmp_path), gradient_compression="bf16")
    options = trainer.options
    assert isinstance(options, TrainerOptions)
    assert options.backup == tfdist.BackupOptions(str(tmp_path))
    assert options.exchange == tfdist.ExchangeOptions(compression="bf16")
    assert options.precision == "float32" and options.accumulation_steps == 1
    assert options.balance is None and options.steps_per_execution == "auto"
    for name in ("precision", "accumulation_steps", "backup", "lr_scaling", "exchange"):
        assert getattr(trainer, name) == getattr(options, name)
    assert trainer.watchdog is options.watchdog and trainer.pipeline is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.backup = None
    with pytest.raises(AttributeError, match="read-only"):
        trainer.exchange = tfdist.ExchangeOptions()


@pytest.mark.parametrize("shortcut,value", [("backup_freq", 5), ("keep_backups", 2)])
def test_a_backup_shortcut_without_a_directory_is_refused(shortcut, value):
    # It would make no backups: refused, not ignored.
    with pytest.raises(
        ValueError,
        match=rf"argument `{shortcut}`. Received: {shortcut}={value}. "
        r"Expected None unless `backup_dir` is given",
    ):
        _trainer(**{shortcut: value})


def test_option_objects_are_frozen_and_exported():
    options = tfdist.BackupOptions("dir")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.freq = 3
    assert tfdist.training.LRScaling is tfdist.LRScaling
    assert (options.freq, options.keep_last, options.keep_after_success) == ("epoch", 1, False)


@pytest.mark.parametrize(
    "kwargs,pattern",
    [
        (
            {"lr_scaling": tfdist.LRScaling("linear"), "warmup_steps": 3},
            "argument `warmup_steps`. Received: warmup_steps=3. "
            "Expected None when `lr_scaling` is given",
        ),
        (
            {"exchange": tfdist.ExchangeOptions(), "bucket_bytes": 8},
            "argument `bucket_bytes`. Received: bucket_bytes=8. "
            "Expected None when `exchange` is given",
        ),
        (
            {"exchange": {"compression": "bf16"}},
            "argument `exchange`.*Expected a tfdist.ExchangeOptions or None",
        ),
        (
            {"keep_backup": "yes"},
            "argument `keep_backup`. Received: keep_backup='yes'. Expected True or False",
        ),
    ],
)
def test_option_errors_name_what_the_user_wrote(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        _trainer(**kwargs)


def test_an_lr_scaling_object_trains_as_its_shortcuts():
    x, y = data(96)
    histories = []
    for options in (
        {"lr_scaling": tfdist.LRScaling("linear", base_global_batch_size=16, warmup_epochs=1)},
        {"lr_scaling": "linear", "base_global_batch_size": 16, "warmup_epochs": 1},
    ):
        trainer = tfdist.Trainer(
            builder(initial_weights()),
            strategy=tfdist.make_strategy("one_device"),
            optimizer=keras.optimizers.SGD(0.1),
            loss=LOSS,
            **options,
        )
        histories.append(trainer.fit((x, y), epochs=2, global_batch_size=32, verbose=0).history)
    # effective batch 32 over a base of 16: 0.1 -> 0.2, reached after epoch 1's 3 warmup updates.
    assert histories[0]["learning_rate"] == pytest.approx([0.2, 0.2])
    assert histories[0].keys() == histories[1].keys()
    for key, values in histories[0].items():
        assert histories[1][key] == pytest.approx(values, abs=1e-6)


def test_as_floats_takes_tensors_numpy_and_numbers():
    logs = {
        "loss": tf.constant(0.5),
        "accuracy": np.float32(0.25),
        "updates": tf.constant(3, tf.int64),
        "n": 2,
    }
    assert as_floats(logs) == {"loss": 0.5, "accuracy": 0.25, "updates": 3.0, "n": 2.0}
    assert all(type(v) is float for v in as_floats(logs).values())
    assert list(as_floats(logs)) == list(logs)
