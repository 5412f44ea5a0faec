"""Sharded gradients and parameters equal to unsharded bit for bit on a pre-norm transformer
(issue 42: the memory bench's GPT ended 2.3e-6 apart), mirrored x2, one Adam update.

A ``LayerNormalization`` reads its input three times, and that input is also the residual's:
as a unit (a custom gradient) it summed its own three contributions before the tape added the
residual's, where the whole model's tape adds all four in one go; Adam turned the rounding
into 5.1e-6 in one update (a 2-block GPT of width 64). Such a small layer at a branch runs on
the step's tape (`tfdist.training.zero.units.on_the_tape`). The weights are Keras's initial
ones (zero biases, unit gammas): later updates are a rounding apart again where TF's graph
optimizer rewrites a sum across a unit's boundary in the whole model's graph only (its
arithmetic optimizer; with it off, in-process experiments were bitwise).
"""

import functools

import keras
import numpy as np
import pytest

import tfdist
from tfdist.training.zero.units import on_the_tape

VOCAB, SEQ, BATCH = 32, 8, 8


def gpt():
    return tfdist.models.get(
        "gpt", input_shape=(SEQ,), num_classes=VOCAB, width=16, depth=1, heads=2
    )


def test_the_layer_norms_beside_a_residual_run_on_the_tape():
    model = gpt()
    found = sorted(layer.name for layer in model.layers if id(layer) in on_the_tape(model))
    # Not final_ln: only the logits read its input. Not the attention: its input is the norm's.
    assert found == ["block_0_ln_0", "block_0_ln_1"]
    assert not on_the_tape(model, below=16)  # larger ones stay units


@functools.cache
def weights(sharding):
    keras.utils.set_random_seed(0)
    tokens = np.random.default_rng(0).integers(0, VOCAB, (BATCH, SEQ + 1)).astype(np.int32)
    trainer = tfdist.Trainer(
        gpt,
        strategy=tfdist.make_strategy("mirrored", num_devices=2),
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        sharding=sharding,
    )
    trainer.fit(tokens[:, :-1], tokens[:, 1:], batch_size=BATCH, epochs=1, shuffle=False)
    return {v.path: v.numpy() for v in trainer.model.weights}


@pytest.mark.parametrize("sharding", ["gradients", "parameters"])
def test_one_adam_update_is_unsharded_bit_for_bit(sharding):
    base, sharded = weights(None), weights(sharding)
    assert base.keys() == sharded.keys()
    for path in base:
        np.testing.assert_array_equal(sharded[path], base[path], err_msg=path)
