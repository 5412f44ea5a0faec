"""Sharded optimizer state and gradients (ZeRO-1/2; tfdist/training/zero/state.py), mirrored x2.

Each sharded run is compared with the same run unsharded, on the same strategy: the weights
must be equal (1e-7 with Adam, AdamW and SGD with momentum; 1e-6 with accumulation under
``"gradients"``, which sums micro-batches after their all-reduce, and with bf16). Two real
MultiWorkerMirrored workers: tests/strategies/test_multi_worker.py (the shared launch).
"""

import logging

import keras
import numpy as np
import pytest

import tfdist
from tests.jobs.common import builder, data, initial_weights
from tfdist.strategies.ps.runner import PSRunner
from tfdist.training.zero.state import check_sharding

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
W0 = initial_weights()


def _fit(optimizer, sharding=None, *, k=1, steps=3, precision="float32", x=None, **options):
    trainer = tfdist.Trainer(
        builder(W0),
        strategy=tfdist.make_strategy("mirrored", num_devices=2),
        optimizer=optimizer,
        loss=LOSS,
        accumulation_steps=k,
        precision=precision,
        sharding=sharding,
        **options,
    )
    xs, ys = data(48)
    xs = xs if x is None else x
    trainer.fit(xs, ys, batch_size=16 // k, epochs=1, steps_per_epoch=steps, verbose=0)
    return trainer


def _gap(a, b):
    return max(
        float(np.max(np.abs(p - q))) for p, q in zip(a.model.get_weights(), b.model.get_weights())
    )


# Every built-in Keras optimizer whose update is element-wise, each under one of the two modes.
ELEMENTWISE = [
    ("sgd_momentum", lambda: keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True), "optimizer"),
    ("adam", lambda: keras.optimizers.Adam(0.01, amsgrad=True), "gradients"),
    ("adamw", lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1), "optimizer"),
    ("rmsprop", lambda: keras.optimizers.RMSprop(0.01, momentum=0.5, centered=True), "gradients"),
    ("adagrad", lambda: keras.optimizers.Adagrad(0.1), "optimizer"),
    ("adadelta", lambda: keras.optimizers.Adadelta(1.0), "gradients"),
    ("adamax", lambda: keras.optimizers.Adamax(0.01), "optimizer"),
    ("nadam", lambda: keras.optimizers.Nadam(0.01), "gradients"),
    ("ftrl", lambda: keras.optimizers.Ftrl(0.1, l1_regularization_strength=0.01), "optimizer"),
    ("lion", lambda: keras.optimizers.Lion(0.001), "gradients"),
]


def test_every_elementwise_keras_optimizer_trains_sharded_as_unsharded():
    gaps = {}
    for name, make, sharding in ELEMENTWISE:
        gaps[name] = _gap(_fit(make()), _fit(make(), sharding))
    assert all(gap <= 1e-7 for gap in gaps.values()), gaps


def test_accumulation_clipping_compression_and_bf16_match_unsharded():
    # (case, sharding, Trainer options and optimizer, bound)
    cases = [
        ("accumulation", "gradients", dict(k=2), lambda: keras.optimizers.Adam(0.01), 1e-6),
        ("accumulation", "optimizer", dict(k=2), lambda: keras.optimizers.AdamW(0.01), 1e-7),
        # Clipping reads whole tensors' norms: one all-reduce of the blocks' squared norms.
        ("clipnorm", "gradients", {}, lambda: keras.optimizers.Adam(0.01, clipnorm=0.05), 1e-6),
        ("global", "optimizer", {}, lambda: keras.optimizers.SGD(0.5, global_clipnorm=0.05), 1e-6),
        (
            "bf16 wire, buckets",
            "gradients",
            dict(gradient_compression="bf16", bucket_bytes=64),
            lambda: keras.optimizers.Adam(0.01),
            1e-6,
        ),
        (
            "mixed_bfloat16",
            "gradients",
            dict(precision="mixed_bfloat16"),
            keras.optimizers.Adam,
            1e-6,
        ),
    ]
    gaps = {}
    for case, sharding, options, make, bound in cases:
        gap = _gap(_fit(make(), **options), _fit(make(), sharding, **options))
        gaps[f"{case} ({sharding})"] = (gap, bound)
    assert all(gap <= bound for gap, bound in gaps.values()), gaps


def test_loss_scaling_skips_an_overflow_on_every_replica_alike():
    # An input of 1e30 in the second batch, on replica 0 only: its gradients are not finite
    # there, so in replica 1's block of the summed gradient too. Every replica must skip.
    x = data(48)[0].copy()
    x[16] = 1e30
    runs = [
        _fit(keras.optimizers.Adam(0.01), s, precision="mixed_float16", x=x)
        for s in (None, "optimizer", "gradients")
    ]
    skipped = [int(t._functions.skipped_updates.numpy()) for t in runs]
    scales = [float(t.model.optimizer.dynamic_scale.numpy()) for t in runs]
    assert skipped == [1, 1, 1] and len(set(scales)) == 1, (skipped, scales)
    assert _gap(runs[0], runs[1]) <= 1e-7 and _gap(runs[0], runs[2]) <= 1e-7


def test_weight_decay_exclusions_by_object_and_by_name_follow_the_blocks():
    def make(trainer_model=None):
        optimizer = keras.optimizers.AdamW(0.05, weight_decay=0.5)
        optimizer.exclude_from_weight_decay(var_names=["bias"])
        return optimizer

    gap = _gap(_fit(make()), _fit(make(), "optimizer"))
    assert gap <= 1e-7, gap


def test_weight_constraints_apply_to_the_whole_tensors_as_keras_applies_them():
    # MaxNorm reads each column's norm across rows that different replicas' blocks hold.
    def build():
        model = builder(W0)()
        model.layers[0].kernel.constraint = keras.constraints.MaxNorm(0.3)
        model.layers[1].bias.constraint = keras.constraints.NonNeg()
        return model

    def fit(sharding):
        trainer = tfdist.Trainer(
            build,
            strategy=tfdist.make_strategy("mirrored", num_devices=2),
            optimizer=keras.optimizers.SGD(0.5),
            loss=LOSS,
            sharding=sharding,
        )
        trainer.fit(*data(48), batch_size=16, epochs=1, steps_per_epoch=3, verbose=0)
        return trainer

    plain, sharded = fit(None), fit("gradients")
    kernel = sharded.model.layers[0].kernel.numpy()
    assert np.max(np.linalg.norm(kernel, axis=0)) <= 0.3 + 1e-6
    assert _gap(plain, sharded) <= 1e-7


def test_each_replica_holds_its_block_of_the_optimizer_state_and_the_log_says_so(caplog):
    with caplog.at_level(logging.INFO, logger="tfdist"):
        trainer = _fit(keras.optimizers.Adam(0.01), "gradients", k=2)
    held = trainer.replica_bytes
    # 6*8+8 + 8*3+3 = 83 parameters; blocks of 24 + 4 + 12 + 2 = 42 elements per replica.
    assert held["parameters"] == 83 * 4 and held["master_shards"] == 42 * 4
    # m and v, iterations (int64) and the learning rate; sharded: 1/N of m and v, plus padding.
    assert held["unsharded"]["optimizer_state"] == 2 * 83 * 4 + 8 + 4
    assert held["optimizer_state"] == 2 * 42 * 4 + 8 + 4
    assert held["gradients"] == 2 * 42 * 4 and held["unsharded"]["gradients"] == 2 * 83 * 4
    slots = trainer.model.optimizer._momentums
    assert [tuple(v.shape) for v in slots] == [(24,), (4,), (12,), (2,)]
    assert "Sharding 'gradients' over 2 replicas: each replica holds" in caplog.text
    assert _fit(keras.optimizers.Adam(0.01)).replica_bytes["master_shards"] == 0


class _OwnStep(keras.Model):
    def train_step(self, data):
        return super().train_step(data)


@pytest.mark.parametrize(
    "make, sharding, match",
    [
        (lambda: keras.optimizers.Adafactor(), "optimizer", "Adafactor factors"),
        (lambda: keras.optimizers.Lamb(), "gradients", "Lamb scales each tensor"),
        (lambda: keras.optimizers.Muon(), "optimizer", "Muon orthogonalises"),
        (lambda: keras.optimizers.ScheduleFreeAdamW(), "optimizer", "ScheduleFreeAdamW starts"),
        (lambda: keras.optimizers.Adam(use_ema=True), "optimizer", r"use_ema=True\) keeps"),
        (lambda: keras.optimizers.Adam(), "zero", "Expected one of: optimizer, gradients"),
    ],
)
def test_an_optimizer_a_block_cannot_update_is_refused(make, sharding, match):
    with pytest.raises(ValueError, match=f"argument `sharding`.*{match}"):
        _fit(make(), sharding)


def test_sharding_refused_where_there_is_nothing_to_shard_or_tfdist_does_not_step():
    one = tfdist.make_strategy("one_device")
    with pytest.raises(ValueError, match="sharding.*OneDeviceStrategy has one replica"):
        tfdist.Trainer(builder(W0), strategy=one, loss=LOSS, sharding="optimizer")
    with pytest.raises(ValueError, match="sharding.*keeps each variable and its state once"):
        check_sharding("optimizer", PSRunner.__new__(PSRunner))
    mirrored = tfdist.make_strategy("mirrored", num_devices=2)
    with pytest.raises(ValueError, match="`sharding`.*own train_step"):
        inputs = keras.Input((6,))
        tfdist.Trainer(
            _OwnStep(inputs, keras.layers.Dense(3)(inputs)),
            strategy=mirrored,
            loss=LOSS,
            sharding="gradients",
        )
    overwritten = tfdist.Trainer(builder(W0), strategy=mirrored, loss=LOSS, sharding="optimizer")
    overwritten.model.layers[1].bias.overwrite_with_gradient = True  # as float8 scales are
    with pytest.raises(ValueError, match="sharding.*take their gradient as their new value"):
        overwritten.fit(*data(16), batch_size=16, verbose=0)
    trainer = tfdist.Trainer(builder(W0), strategy=mirrored, loss=LOSS, sharding="optimizer")
    with mirrored.scope():  # whole-tensor state, e.g. from a Keras fit
        trainer.model.optimizer.build(trainer.model.trainable_variables)
    with pytest.raises(ValueError, match="sharding.*not built yet"):
        trainer.fit(*data(16), batch_size=16, verbose=0)


def test_a_dense_layer_on_3d_input_is_sharded_by_its_kernels_shape():
    # Its kernel's gradient has static shape (None, 16): the blocks come from the variable's.
    rng = np.random.default_rng(3)
    x = rng.standard_normal((48, 6, 8)).astype("float32")
    weights = [
        0.3 * rng.standard_normal(s).astype("float32") for s in [(8, 16), (16,), (16, 3), (3,)]
    ]

    def fit(sharding, k):
        model = keras.Sequential(
            [
                keras.Input((6, 8)),
                keras.layers.Dense(16),
                keras.layers.GlobalAveragePooling1D(),
                keras.layers.Dense(3),
            ]
        )
        model.set_weights(weights)
        trainer = tfdist.Trainer(
            model,
            strategy=tfdist.make_strategy("mirrored", num_devices=2),
            optimizer=keras.optimizers.Adam(0.01),
            loss=LOSS,
            sharding=sharding,
            accumulation_steps=k,
        )
        trainer.fit(x, data(48)[1], batch_size=16 // k, steps_per_epoch=3 * k, verbose=0)
        return trainer

    plain = fit(None, 1)
    gaps = {(s, k): _gap(plain, fit(s, k)) for s, k in [("optimizer", 1), ("gradients", 2)]}
    assert all(gap <= 1e-6 for gap in gaps.values()), gaps
