"""``tfdist.models.language``: bits per byte is the loss over ln 2, and generation is seeded."""

import math

import numpy as np
import pytest


@pytest.fixture(scope="module")
def tiny_gpt():
    from tfdist import models

    return models.get("gpt", input_shape=(8,), num_classes=256, width=16, depth=1, heads=2)


def test_bits_per_byte_is_the_loss_over_ln_2():
    import keras

    from tfdist.models.language import BitsPerByte

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 5, 256)).astype("float32")
    targets = rng.integers(0, 256, size=(3, 5)).astype("int32")
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(targets, logits)
    metric = BitsPerByte()
    metric.update_state(targets[:2], logits[:2])  # two updates: the mean over every position
    metric.update_state(targets[2:], logits[2:])
    assert metric.name == "bits_per_byte"
    assert float(metric.result()) == pytest.approx(float(loss) / math.log(2), rel=1e-5)


def test_generate_returns_n_bytes_the_same_for_the_same_seed(tiny_gpt):
    from tfdist.models.language import generate

    long_prompt = b"def f(x):\n    return x\n"  # longer than seq_len: its last 8 bytes are read
    for prompt in (b"def ", long_prompt):
        first = generate(tiny_gpt, prompt, 12, temperature=1.0, seed=3)
        assert isinstance(first, bytes) and len(first) == 12
        assert generate(tiny_gpt, prompt, 12, temperature=1.0, seed=3) == first
    assert generate(tiny_gpt, long_prompt, 12, temperature=1.0, seed=4) != first
    greedy = generate(tiny_gpt, b"def ", 6, temperature=0)
    assert greedy == generate(tiny_gpt, b"def ", 6, temperature=0, seed=9)  # greedy: no sampling
    assert len(generate(tiny_gpt, b"d", 4, top_k=1)) == 4
    with pytest.raises(ValueError, match="prompt"):
        generate(tiny_gpt, b"", 4)
