"""Tests for tfdist.models.gpt: shapes, the causal mask, blocks a pipeline cuts between."""

import keras
import numpy as np
import pytest

import tfdist
from tfdist.training.pipeline.options import PipelineOptions

SEQ, VOCAB, WIDTH = 8, 256, 16
TINY = dict(input_shape=(SEQ,), num_classes=VOCAB, width=WIDTH, depth=3, heads=2)
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
TOKENS = np.random.default_rng(0).integers(0, VOCAB, size=(16, SEQ)).astype("int32")
TARGETS = np.roll(TOKENS, -1, axis=1)


def tiny_gpt(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return tfdist.models.get("gpt", **TINY)


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_outputs_float32_logits_per_position(policy):
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        model = tiny_gpt()
        logits = model(TOKENS[:2])
    finally:
        keras.config.set_dtype_policy(previous)
    assert model.name == "gpt" and tuple(logits.shape) == (2, SEQ, VOCAB)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    names = [layer.name for layer in model.layers]
    assert [n for n in names if n.startswith("block_") and n[6:].isdigit()] == [
        "block_0",
        "block_1",
        "block_2",
    ]
    assert names[-2:] == ["final_ln", "logits"]


def test_defaults_and_options():
    model = tfdist.models.get("gpt", input_shape=(128,), num_classes=256)
    assert model.output_shape == (None, 128, 256)
    assert [x.name for x in model.layers if x.name.startswith("block_")][-1] == "block_3"
    assert model.get_layer("block_0_attention").num_heads == 4
    assert model.get_layer("block_0_mlp_0").units == 4 * 128
    with pytest.raises(ValueError, match="argument `input_shape`"):
        tfdist.models.get("gpt", input_shape=(8, 8), num_classes=256)


def test_a_later_token_never_changes_an_earlier_prediction():
    model = tiny_gpt()
    before = model(TOKENS, training=False).numpy()
    for t in (0, SEQ // 2, SEQ - 1):
        changed = TOKENS.copy()
        changed[:, t] = (changed[:, t] + 1) % VOCAB
        after = model(changed, training=False).numpy()
        np.testing.assert_array_equal(after[:, :t], before[:, :t])
        assert np.abs(after[:, t:] - before[:, t:]).max() > 1e-4


def test_a_pipeline_cut_between_blocks_equals_the_uncut_model():
    """Cut after block_1 (of 3): only the residual stream crosses; the loss through the stages
    is the uncut model's, and one SGD epoch matches plain Keras."""
    fit = dict(batch_size=8, epochs=1, verbose=0, shuffle=False)
    want = tiny_gpt()
    want.compile(optimizer=keras.optimizers.SGD(0.1), loss=LOSS)
    want_loss = want.evaluate(TOKENS, TARGETS, batch_size=8, verbose=0)
    want_history = want.fit(TOKENS, TARGETS, **fit).history
    trainer = tfdist.Trainer(
        tiny_gpt,
        optimizer=keras.optimizers.SGD(0.1),
        loss=LOSS,
        pipeline=PipelineOptions(["block_1"], micro_batches=2),
    )
    got = trainer.evaluate(TOKENS, TARGETS, batch_size=8, verbose=0)
    assert [(t.dtype, tuple(t.shape)) for t in trainer.stages[1].model.inputs] == [
        ("float32", (None, SEQ, WIDTH))
    ]
    assert abs(got - want_loss) <= 1e-5
    history = trainer.fit(TOKENS, TARGETS, **fit).history
    np.testing.assert_allclose(history["loss"], want_history["loss"], rtol=1e-5)
    diff = max(
        float(np.max(np.abs(a - b)))
        for a, b in zip(trainer.model.get_weights(), want.get_weights())
    )
    assert diff <= 1e-5


def test_bf16_gpt_follows_keras_own_fit_under_the_same_policy():
    """mixed_bfloat16, Adam, 2 epochs of a one-block GPT on mirrored x2: the Trainer's weights
    and losses are Keras's own ``fit`` in the same MirroredStrategy under the same policy,
    within the 1e-5 docs/python-api.md states for bf16 (equal bit for bit on 2026-12-06, and on
    one device too)."""

    def one_block() -> keras.Model:
        keras.utils.set_random_seed(0)
        return tfdist.models.get("gpt", **{**TINY, "depth": 1})

    fit = dict(batch_size=8, epochs=2, verbose=0, shuffle=False)
    strategy = tfdist.make_strategy("mirrored", num_devices=2)
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        with strategy.scope():
            want = one_block()
            want.compile(optimizer=keras.optimizers.Adam(1e-2), loss=LOSS)
        want_history = want.fit(TOKENS, TARGETS, **fit).history
    finally:
        keras.mixed_precision.set_global_policy("float32")
    trainer = tfdist.Trainer(
        one_block,
        strategy=strategy,
        optimizer=keras.optimizers.Adam(1e-2),
        loss=LOSS,
        precision="mixed_bfloat16",
    )
    history = trainer.fit(TOKENS, TARGETS, **fit).history
    assert trainer.model.dtype_policy.name == "mixed_bfloat16"
    np.testing.assert_allclose(history["loss"], want_history["loss"], rtol=1e-5)
    for got, expected in zip(trainer.model.get_weights(), want.get_weights()):
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
