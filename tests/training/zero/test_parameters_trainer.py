"""``Trainer(sharding="parameters")`` (ZeRO-3; zero/parameters_update.py), mirrored x2.

Each sharded fit is compared with the unsharded Trainer on the same strategy, data and initial
weights (the MLP of tests/training/zero/test_parameters.py: BatchNormalization, a kernel and an
activity regularizer, a MaxNorm constraint): the final weights to 1e-6 with Adam, the
validation logs alike; after fit the model is whole (``get_weights``, ``save`` + ``load_model``),
its blocks empty buffers (a read of one raises) and Adam's slots kept, and a second fit cuts it
again. SGD, accumulation (Adam, k=2) and variable-less ``add_loss``
layers: tests/training/zero/test_per_layer.py; the transformer block: test_parameters.py. Two
real MultiWorkerMirrored workers: tests/strategies/test_multi_worker.py (the shared launch's
``trainer_zero3`` mode). A subclassed model, unbuilt, trains as one unit (its weights, with Adam,
and its validation logs as unsharded; its ``gathered_unit`` the whole model), and so does a
functional transformer block whose embedding's mask travels between the units (over two fits, its
blocks empty between them, as the MLP's). Each refusal names
its argument, before anything is traced. A loss per token with masked terms (an output's
Keras mask and ``ignore_class``) is divided by the valid count of both replicas (weights and
logs as unsharded, and Keras's fit on one device), with accumulation too (k=2: the count of
both micro-batches); beside a regularizer under accumulation it is refused. AdamW's
exclusions from weight decay by variable object hold for the blocks (and ZeRO-1's master
shards).
"""

import logging

import keras
import numpy as np
import pytest

import tfdist
from tests.training.zero.test_parameters import (
    LOSS,
    TOKENS,
    VOCAB,
    G,
    _data,
    _mlp,
    _with,
    masked_transformer,
)
from tfdist._compat.keras_internals.storage import held_elements
from tfdist.config import TrainConfig
from tfdist.training.fit.arguments import reads_weights
from tfdist.training.zero.parameters import check_trainer


def _trainer(build, weights, optimizer, sharding, *, replicas=2, **options):
    return tfdist.Trainer(
        lambda: _with(build(), weights),
        strategy=tfdist.make_strategy("mirrored", num_devices=replicas),
        optimizer=optimizer,
        loss=LOSS,
        metrics=["accuracy"],
        sharding=sharding,
        **options,
    )


def _fit(trainer, x, y, *, k=1, fits=1, between=None):
    """``fits`` fits of one epoch each (the first 24 examples; 12 held out for validation),
    ``between(trainer)`` called after each but the last."""
    logs = []
    for fit in range(fits):
        if fit and between is not None:
            between(trainer)
        history = trainer.fit(
            x[:24],
            y[:24],
            batch_size=G // k,
            epochs=1,
            shuffle=False,
            verbose=0,
            validation_data=(x[24:], y[24:]),
        )
        logs.append({key: values[-1] for key, values in history.history.items()})
    return logs


def _gap(a, b):
    return max(float(np.max(np.abs(p - q))) for p, q in zip(a, b, strict=True))


SGD, ADAM = (lambda: keras.optimizers.SGD(0.1)), (lambda: keras.optimizers.Adam(0.01))
# For the models with attention, Adam's epsilon 1e-3: the key bias has a zero gradient in exact
# arithmetic (the softmax over keys ignores q.b_k), and under Keras's 1e-7 Adam turns its
# rounding noise into steps of the learning rate's size, which differ between any two
# exchanges (the masked-loss model's largest gap was its key bias: 5.2e-8, 1.1e-7 from Keras;
# now 1.5e-8 both, on other weights).
ADAM_ATTENTION = lambda: keras.optimizers.Adam(0.01, epsilon=1e-3)  # noqa: E731


def test_fit_with_sharded_parameters_ends_as_unsharded(tmp_path):
    # Adam (SGD: tests/training/zero/test_per_layer.py's add_loss test, k=1, and its MLP's
    # accumulation with Adam, k=2).
    build = _mlp
    weights = build().get_weights()
    x, y = _data(build())
    mine = _trainer(build, weights, ADAM(), "parameters")
    theirs = _trainer(build, weights, ADAM(), None)
    mine_logs = _fit(mine, x, y, fits=2, between=_emptied)  # cut again
    their_logs = _fit(theirs, x, y, fits=2)
    # Between fits and after: the model is whole, plain Keras.
    assert _gap(mine.model.get_weights(), theirs.model.get_weights()) <= 1e-6
    _blocks_are_empty_between_fits(mine._functions.sharded)
    assert _gap(theirs.model.get_weights(), weights) > 1e-3  # the runs train
    for a, b in zip(mine_logs, their_logs, strict=True):
        assert a.keys() == b.keys() and {"val_loss", "val_accuracy"} <= set(a)
        assert all(abs(a[key] - b[key]) <= 1e-5 for key in a), (a, b)
    held = mine.replica_bytes
    assert held["gathered_unit"] > 0 and held["master_shards"] == 0
    assert held["parameters"] < held["unsharded"]["parameters"]
    # Saved and loaded: an ordinary Keras model with the same predictions.
    path = str(tmp_path / "m.keras")
    mine.model.save(path)
    loaded = keras.saving.load_model(path)
    assert type(loaded) is keras.Sequential
    plain = _with(build(), mine.model.get_weights())  # outside the strategy, as loaded
    got, want = loaded.predict(x, verbose=0), plain.predict(x, verbose=0)
    np.testing.assert_allclose(got, want, atol=1e-6)
    # And its optimizer state, whole: the unsharded run's.
    saved = [v.numpy() for v in loaded.optimizer.variables]
    assert _gap(saved, [v.numpy() for v in theirs.model.optimizer.variables]) <= 1e-6


def _emptied(trainer):
    """`_blocks_are_empty_between_fits` on a sharded Trainer."""
    _blocks_are_empty_between_fits(trainer._functions.sharded)


def _blocks_are_empty_between_fits(state):
    """Between fits only the whole variables hold bytes: every block is an empty buffer (its
    optimizer slots are not: the next fit and its backups need them), and a read raises."""
    assert state.whole and state.cut_indices
    for i in state.cut_indices:
        assert held_elements(state.block_storage[i]) == [0, 0]  # both replicas
        assert held_elements(state.storage[i]) == [state.variables[i].shape.num_elements()] * 2
    slots = [v for v in state.model.optimizer.variables if len(v.shape)]
    assert all(min(held_elements(v.value)) > 0 for v in slots)
    with pytest.raises(RuntimeError, match="was read between fits, where it is empty"):
        state.blocks[state.cut_indices[0]].numpy()


def _mlp_without_activity_loss():
    # Keras's own loss cannot sum a bfloat16 activity loss with float32 ones (unsharded too).
    return keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(9, kernel_regularizer=keras.regularizers.L2(0.01)),
            keras.layers.BatchNormalization(),
            keras.layers.Dense(3, kernel_constraint=keras.constraints.MaxNorm(0.5)),
        ]
    )


def test_bf16_and_global_clipnorm_on_sharded_parameters_train_as_unsharded():
    # global_clipnorm needs the norm over all the blocks: one small all-reduce. Every variable
    # cut, and the biases and BatchNormalization's gamma and beta (9 and 3 elements) kept whole
    # (keep_whole_below=10: their norms counted once), against unsharded, all mixed_bfloat16.
    build = _mlp_without_activity_loss
    weights = build().get_weights()
    x, y = _data(build())
    runs = [
        _trainer(
            build,
            weights,
            keras.optimizers.SGD(0.5, global_clipnorm=0.05),
            sharding,
            precision="mixed_bfloat16",
            keep_whole_below=kept,
        )
        for sharding, kept in (("parameters", None), ("parameters", 10), (None, None))
    ]
    for trainer in runs:
        trainer.fit(x, y, batch_size=G, epochs=1, shuffle=False, verbose=0)
    assert len(runs[1]._functions.sharded.kept) == 4 and not runs[0]._functions.sharded.kept
    cut, kept, theirs = (t.model.get_weights() for t in runs)
    assert _gap(cut, theirs) <= 1e-6 and _gap(kept, theirs) <= 1e-6
    assert _gap(theirs, weights) > 1e-3


def test_loss_scaling_skips_an_overflow_on_every_replica_alike():
    # mixed_float16: an input of 1e30 in the second batch, on replica 0 only; its gradients are
    # not finite there, and so in replica 1's blocks: every replica skips that update.
    def build():
        return keras.Sequential(
            [keras.Input((6,)), keras.layers.Dense(9, activation="tanh"), keras.layers.Dense(3)]
        )

    weights = build().get_weights()
    x, y = _data(build())
    x[G] = 1e30
    runs = [
        _trainer(build, weights, ADAM(), sharding, precision="mixed_float16")
        for sharding in ("parameters", None)
    ]
    for trainer in runs:
        trainer.fit(x, y, batch_size=G, epochs=1, shuffle=False, verbose=0)
    skipped = [int(t._functions.skipped_updates.numpy()) for t in runs]
    scales = [float(t.model.optimizer.dynamic_scale.numpy()) for t in runs]
    assert skipped == [1, 1] and len(set(scales)) == 1, (skipped, scales)
    assert _gap(runs[0].model.get_weights(), runs[1].model.get_weights()) <= 1e-6


def test_one_replica_trains_unsharded_with_the_log_line(caplog):
    weights = _mlp().get_weights()
    x, y = _data(_mlp())
    trainer = _trainer(_mlp, weights, SGD(), "parameters", replicas=1)
    with caplog.at_level(logging.INFO):
        trainer.fit(x, y, batch_size=G, epochs=1, verbose=0, shuffle=False)
    assert "Sharding 'parameters' over 1 replica" in caplog.text


class _OwnStep(keras.Model):
    def train_step(self, data):
        return super().train_step(data)


def _own_step_model():
    x = keras.Input((6,))
    return _OwnStep(x, keras.layers.Dense(3)(x))


class _Tokens(keras.Model):
    """A subclassed transformer-ish model on token ids: a masked embedding, attention, a Dense
    over 3-D input, masked pooling. Seeded initializers: instances built apart start alike."""

    def __init__(self):
        super().__init__(name="tokens")  # Keras's own name, "__tokens", is no valid scope name
        self.embed = keras.layers.Embedding(
            VOCAB,
            8,
            mask_zero=True,
            embeddings_initializer=keras.initializers.RandomUniform(seed=1),
        )
        seeded = keras.initializers.GlorotUniform
        self.attend = keras.layers.MultiHeadAttention(2, 4, kernel_initializer=seeded(seed=2))
        self.dense = keras.layers.Dense(8, activation="gelu", kernel_initializer=seeded(seed=3))
        self.pool = keras.layers.GlobalAveragePooling1D()
        self.head = keras.layers.Dense(3, kernel_initializer=seeded(seed=4))

    def call(self, ids):
        h = self.embed(ids)
        return self.head(self.pool(self.dense(self.attend(h, h))))


def _masked_output(*, regularized=False):
    """A Keras mask on the output: an ``Embedding(mask_zero=True)`` through attention and a
    Dense per token (trained with a loss per token: masked terms), its kernel regularized or
    not (a term beside the masked one)."""
    ids = keras.Input((TOKENS,), dtype="int32")
    embedded = keras.layers.Embedding(VOCAB, 4, mask_zero=True)(ids)
    attended = keras.layers.MultiHeadAttention(num_heads=1, key_dim=4)(embedded, embedded)
    regularizer = keras.regularizers.L2(0.01) if regularized else None
    return keras.Model(ids, keras.layers.Dense(3, kernel_regularizer=regularizer)(attended))


#: The per-token loss of `_masked_output`: the padding masked and, with ``ignore_class``, label 2.
TOKEN_LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=2)


def _token_model(kind, x):
    """``(make, start)``: a builder of the ``kind`` model and a built one with its initial
    weights. ``"subclassed"``: `_Tokens`, unbuilt, as Keras's fit takes it (each Trainer builds
    it from the first batch; seeded: alike); ``"masked"``: `masked_transformer`;
    ``"masked_loss"``: `_masked_output`."""
    build = {"subclassed": _Tokens, "masked": masked_transformer, "masked_loss": _masked_output}
    build["masked_loss_k2"] = _masked_output
    start = build[kind]()
    start(x[:1])
    if kind == "subclassed":
        return _Tokens, start
    weights = start.get_weights()
    return (lambda: _with(build[kind](), weights)), start


@pytest.mark.parametrize("kind", ["subclassed", "masked", "masked_loss", "masked_loss_k2"])
def test_token_models_train_as_unsharded(kind):
    # A subclassed model runs as one unit: its call whole under one gather of all its weights.
    # The masked functional one: an Embedding(mask_zero=True)'s mask crosses the units' custom
    # gradients to the attention, the residual and the pooling, forward and recomputed.
    # "masked_loss": a loss per token with masked terms (the output's mask, ignore_class), each
    # replica's valid count its own: divided by the count over both replicas, as unsharded;
    # "_k2": accumulation_steps=2, over the count of both micro-batches too. "masked" fits
    # twice (each Trainer), its blocks empty between the fits: a transformer's (an
    # Embedding's, the attention's, a LayerNormalization's) filled again at the second's start.
    x, y = _data(None, ids=True)
    make, start = _token_model(kind, x)
    loss, k = LOSS, 2 if kind.endswith("_k2") else 1
    if kind.startswith("masked_loss"):
        y, loss = (x + np.arange(len(x))[:, None]) % 3, TOKEN_LOSS
    runs = {
        sharding: tfdist.Trainer(
            make,
            strategy=tfdist.make_strategy("mirrored", num_devices=2),
            optimizer=ADAM_ATTENTION(),
            loss=loss,
            metrics=["accuracy"],
            sharding=sharding,
            accumulation_steps=k,
        )
        for sharding in ("parameters", None)
    }
    fits = 2 if kind == "masked" else 1
    logs = {
        sharding: _fit(trainer, x, y, k=k, fits=fits, between=_emptied if sharding else None)
        for sharding, trainer in runs.items()
    }
    mine, theirs = (runs[sharding].model for sharding in ("parameters", None))
    assert _gap(mine.get_weights(), theirs.get_weights()) <= 1e-6
    assert _gap(theirs.get_weights(), start.get_weights()) > 1e-3  # the runs train
    for a, b in zip(logs["parameters"], logs[None], strict=True):  # each fit's last logs
        assert a.keys() == b.keys() and all(abs(a[k] - b[k]) <= 1e-5 for k in b), logs
    # One unit: a replica gathers the whole subclassed model while it runs.
    whole = sum(v.numpy().nbytes for v in mine.trainable_variables)
    gathered = runs["parameters"].replica_bytes["gathered_unit"]
    assert gathered == whole if kind == "subclassed" else gathered < whole
    if loss is TOKEN_LOSS:  # and Keras's own fit on one device, on the global batches
        plain = make()
        plain.compile(optimizer=ADAM_ATTENTION(), loss=loss, jit_compile=False)
        plain.fit(x[:24], y[:24], batch_size=G, epochs=1, shuffle=False, verbose=0)
        assert _gap(theirs.get_weights(), plain.get_weights()) <= 1e-5


@pytest.mark.parametrize(
    "options, argument",
    [
        ({"local_sgd": tfdist.LocalSGDOptions(sync_every=2)}, "local_sgd"),
        ({"gradient_compression": "bf16"}, "gradient_compression"),
        ({"bucket_bytes": 1024}, "bucket_bytes"),
        ({"balance": True}, "balance"),
        ({"build": _own_step_model}, "sharding"),
    ],
    ids=["local_sgd", "compression", "buckets", "balance", "train_step"],
)
def test_what_sharded_parameters_cannot_serve_is_refused_by_name(options, argument):
    options = dict(options)
    build = options.pop("build", _mlp)
    with pytest.raises(ValueError, match=f"Invalid value for argument `{argument}`"):
        _trainer(build, build().get_weights(), SGD(), "parameters", **options)


def test_the_command_line_takes_sharding_parameters():
    assert TrainConfig(sharding="parameters").sharding == "parameters"
    with pytest.raises(ValueError, match="optimizer, parameters"):
        TrainConfig(sharding="weights")


def test_a_pipeline_and_masked_loss_terms_beside_others_with_accumulation_are_refused():
    with pytest.raises(ValueError, match="`sharding`.*with pipeline="):
        check_trainer(pipeline=object())
    # A masked loss's valid count is the whole update's: known after each micro-batch's backward
    # has reduced its gradients into the blocks; the update can weigh a lone masked term's
    # gradient sum then, not one beside a regularizer's.
    ids, _ = _data(None, ids=True)
    trainer = tfdist.Trainer(
        lambda: _masked_output(regularized=True),
        strategy=tfdist.make_strategy("mirrored", num_devices=2),
        optimizer=SGD(),
        loss=TOKEN_LOSS,
        sharding="parameters",
        accumulation_steps=2,
    )
    with pytest.raises(ValueError, match="`accumulation_steps`.*masked terms"):
        trainer.fit(ids, ids % 3, batch_size=G, epochs=1, verbose=0)


def test_callbacks_that_read_the_weights_during_fit_are_refused_at_its_start(tmp_path):
    # Before anything is traced: the weights have no storage during such a fit.
    trainer = _trainer(_mlp, _mlp().get_weights(), SGD(), "parameters")
    x, y = _data(_mlp())
    refused = [
        keras.callbacks.ModelCheckpoint(str(tmp_path / "m.keras")),
        keras.callbacks.EarlyStopping(restore_best_weights=True),
        keras.callbacks.SwapEMAWeights(),
        keras.callbacks.TensorBoard(str(tmp_path / "tb"), histogram_freq=1),
        keras.callbacks.TensorBoard(str(tmp_path / "tb"), embeddings_freq=1),
    ]
    for callback in refused:
        name = type(callback).__name__
        with pytest.raises(ValueError, match=f"`sharding`.*parameters.*{name}"):
            trainer.fit(x, y, batch_size=G, epochs=1, verbose=0, callbacks=[callback])
    accepted = [  # the backup callbacks become the Trainer's backups: test_parameters_backup.py
        keras.callbacks.BackupAndRestore(str(tmp_path / "backup")),
        tfdist.callbacks.BackupAndRestore(str(tmp_path / "backup")),
        keras.callbacks.EarlyStopping(monitor="loss"),
        keras.callbacks.TensorBoard(str(tmp_path / "tb")),
        keras.callbacks.ReduceLROnPlateau(monitor="loss"),
    ]
    assert not [c for c in accepted if reads_weights(c)]


def _decayed_mlp(*, compiled=True):
    """A Dense, a LayerNormalization and a Dense, compiled with AdamW that excludes the
    normalization's gamma and the last bias from weight decay by object (``var_list=``)."""
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(9, activation="tanh"),
            keras.layers.LayerNormalization(),
            keras.layers.Dense(3),
        ]
    )
    if compiled:
        optimizer = keras.optimizers.AdamW(0.01, weight_decay=0.1)
        optimizer.exclude_from_weight_decay(var_list=[model.layers[1].gamma, model.layers[2].bias])
        model.compile(optimizer=optimizer, loss=LOSS)
    return model


def test_weight_decay_exclusions_by_object_follow_every_sharding():
    # Excluded by the variable objects (by name: tests/training/zero/test_sharding.py): the
    # blocks and master shards are other variables, and must be excluded too. gamma starts at
    # 1, so each update's decay of it would be 1e-3 (lr x weight_decay): far above 1e-6.
    # "gradients" makes its master shards as "optimizer" does (zero/state.py's ShardedState).
    weights = _decayed_mlp(compiled=False).get_weights()
    x, y = _data(_decayed_mlp(compiled=False))
    final = {}
    for sharding in (None, "parameters", "optimizer"):
        trainer = tfdist.Trainer(
            lambda: _with(_decayed_mlp(), weights),
            strategy=tfdist.make_strategy("mirrored", num_devices=2),
            sharding=sharding,
        )
        trainer.fit(x, y, batch_size=G, epochs=1, shuffle=False, verbose=0)
        final[sharding] = trainer.model.get_weights()
    # The reference is Keras's own fit on one device (the global batch): the exclusions hold.
    plain = _with(_decayed_mlp(), weights)
    plain.fit(x, y, batch_size=G, epochs=1, shuffle=False, verbose=0)
    assert _gap(final[None], plain.get_weights()) <= 1e-5
    gaps = {sharding: _gap(final[sharding], final[None]) for sharding in final}
    assert all(gap <= 1e-6 for gap in gaps.values()), gaps
