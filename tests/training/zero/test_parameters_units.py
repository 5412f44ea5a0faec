"""``units=`` (``ExchangeOptions(units=...)``, ``Trainer(units=...)``; zero/named_units.py and
units.py), mirrored x2 against the unsharded Trainer: a SUBCLASSED transformer (an Embedding, a
Python list of blocks each with MultiHeadAttention, Dense layers over 3-D input and
LayerNormalization, a final Dense) with its blocks named by class (Adam) or by name (SGD)
(2 blocks; by name one of them, the other gathered for the step with the embedding and the
head) trains as unsharded (1e-6) while a replica gathers one block at a time
(``replica_bytes["gathered_unit"]`` one block's weights, not the whole model's); a functional
model with some of its layers named too; and the refusals, each naming ``units``.
"""

import keras
import numpy as np
import pytest

import tfdist
from tests.training.zero.test_parameters import LOSS, TOKENS, VOCAB, G, _data, _with
from tests.training.zero.test_parameters_trainer import _gap
from tfdist import ExchangeOptions
from tfdist.training.zero.named_units import find_units

WIDTH = 8
seeded = keras.initializers.GlorotUniform


class Block(keras.layers.Layer):
    """A post-norm transformer block: attention and a two-layer MLP over 3-D input."""

    def __init__(self, seed, **kwargs):
        super().__init__(**kwargs)
        self.attend = keras.layers.MultiHeadAttention(2, 4, kernel_initializer=seeded(seed))
        self.norm1 = keras.layers.LayerNormalization()
        self.up = keras.layers.Dense(16, activation="gelu", kernel_initializer=seeded(seed + 1))
        self.down = keras.layers.Dense(WIDTH, kernel_initializer=seeded(seed + 2))
        self.norm2 = keras.layers.LayerNormalization()

    def call(self, h):
        h = self.norm1(h + self.attend(h, h))
        return self.norm2(h + self.down(self.up(h)))


class Gpt(keras.Model):
    """Embedding, a Python list of `Block`s, pooling and a Dense head; seeded."""

    def __init__(self):
        super().__init__(name="gpt")
        self.embed = keras.layers.Embedding(
            VOCAB, WIDTH, embeddings_initializer=keras.initializers.RandomUniform(seed=1)
        )
        self.blocks = [Block(10 * (i + 1), name=f"block_{i}") for i in range(2)]
        self.pool = keras.layers.GlobalAveragePooling1D()
        self.head = keras.layers.Dense(3, kernel_initializer=seeded(4))

    def call(self, ids):
        h = self.embed(ids)
        for block in self.blocks:
            h = block(h)
        return self.head(self.pool(h))


def _functional():
    x = keras.Input((TOKENS,), dtype="int32")
    h = keras.layers.Embedding(VOCAB, WIDTH, name="embed")(x)
    a = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, name="attend")(h, h)
    h = keras.layers.LayerNormalization(name="norm")(keras.layers.Add()([h, a]))
    h = keras.layers.Dense(16, activation="gelu", name="up")(h)
    return keras.Model(x, keras.layers.Dense(3)(keras.layers.GlobalAveragePooling1D()(h)))


def _built(make, x):
    model = make()
    model(x[:1])
    return model


def _runs(make, x, optimizer, options):
    weights = _built(make, x).get_weights()
    return {
        key: tfdist.Trainer(
            lambda: _with(_built(make, x), weights),
            strategy=tfdist.make_strategy("mirrored", num_devices=2),
            optimizer=optimizer(),
            loss=LOSS,
            **kwargs,
        )
        for key, kwargs in (("units", options), ("plain", {}))
    }, weights


def _bytes(layer):
    return sum(v.numpy().nbytes for v in layer.trainable_variables)


@pytest.mark.parametrize(
    "make, optimizer, options",
    [
        (Gpt, "adam", {"sharding": "parameters", "units": (Block,)}),
        (Gpt, "sgd", {"exchange": ExchangeOptions(sharding="parameters", units=("block_1",))}),
        (_functional, "adam", {"sharding": "parameters", "units": ["attend", "up"]}),
    ],
    ids=["subclassed-class-adam", "subclassed-names-sgd", "functional-names-adam"],
)
def test_named_units_train_as_unsharded(make, optimizer, options):
    x, y = _data(None, ids=True)
    # Adam's epsilon 1e-3: the attention's key bias has a zero gradient in exact arithmetic (the
    # softmax over keys ignores q.b_k), and under Keras's 1e-7 Adam turns its rounding noise
    # into steps of the learning rate's size, which differ between any two exchanges (the
    # functional model's weights were 2.0e-7 apart under 1e-7, 5x under the bound; now 3.0e-8).
    adam = lambda: keras.optimizers.Adam(0.01, epsilon=1e-3)  # noqa: E731
    choose = {"adam": adam, "sgd": lambda: keras.optimizers.SGD(0.1)}
    runs, start = _runs(make, x, choose[optimizer], options)
    for trainer in runs.values():
        trainer.fit(x, y, batch_size=G, epochs=1, shuffle=False, verbose=0)
    mine, theirs = (runs[k].model for k in ("units", "plain"))
    assert _gap(theirs.get_weights(), start) > 1e-3  # the runs train
    assert _gap(mine.get_weights(), theirs.get_weights()) <= 1e-6
    state = runs["units"]._functions.sharded
    held = runs["units"].replica_bytes
    largest = max(_bytes(layer) for layer in state.units)
    rest = _bytes(mine) - sum(_bytes(layer) for layer in state.units)  # gathered for the step
    assert held["gathered_unit"] == largest + rest <= _bytes(mine), held


def test_the_units_found_anywhere_and_the_refusals():
    x, _ = _data(None, ids=True)
    model = _built(Gpt, x)
    assert [layer.name for layer in find_units(model, (Block,))] == ["block_0", "block_1"]
    assert [layer.name for layer in find_units(model, ("block_1", Block))] == ["block_0", "block_1"]
    for units, expected in [
        (("blocks_9",), "'blocks_9' matches no layer"),
        ((Block, keras.layers.Dense), "inside 'block_0'"),
        (("gpt",), "the model itself"),
        ((keras.layers.Conv2D,), "Conv2D matches no layer"),
    ]:
        with pytest.raises(ValueError, match="units") as raised:
            find_units(model, units)
        assert expected in str(raised.value), str(raised.value)


@pytest.mark.parametrize(
    "options, expected",
    [
        ({"units": (Block,)}, "None with sharding=None"),
        ({"sharding": "gradients", "units": ("b",)}, "None with sharding='gradients'"),
        ({"sharding": "parameters", "units": ()}, "a non-empty tuple"),
        ({"sharding": "parameters", "units": "block_0"}, "a non-empty tuple"),
        ({"sharding": "parameters", "units": (Block, 3)}, "3 (int) is neither"),
        ({"sharding": "parameters", "units": (np.ndarray,)}, "is neither"),
    ],
)
def test_units_option_refusals(options, expected):
    with pytest.raises(ValueError, match="units") as raised:
        ExchangeOptions(**options)
    assert expected in str(raised.value), str(raised.value)
