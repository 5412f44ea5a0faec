"""Trainer model placement: subclassed instances, built or not, and `precision="auto"` with a
made model."""

import keras
import numpy as np
import pytest

import tfdist
from tests.jobs.common import dataset
from tfdist.training.build.placement import created_in_scope

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@pytest.fixture(scope="module")
def mirrored():
    return tfdist.make_strategy("mirrored", num_devices=2)


class Net(keras.Model):
    """Subclassed, with a constructor argument that Keras's automatic config does not record."""

    def __init__(self, units=3, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.hidden = keras.layers.Dense(8, activation="tanh")
        self.out = keras.layers.Dense(units)

    def call(self, x):
        return self.out(self.hidden(x))


class ConfiguredNet(Net):
    def get_config(self):
        return {**super().get_config(), "units": self.units}


def _fits(trainer):
    history = trainer.fit(dataset(), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert created_in_scope(trainer.strategy, trainer.model)


def test_unbuilt_subclassed_instance_is_built_in_the_scope(mirrored):
    model = Net(units=3)
    trainer = tfdist.Trainer(model, strategy=mirrored, optimizer="sgd", loss=LOSS)
    assert trainer.model is model
    _fits(trainer)


@pytest.mark.parametrize("cls", [Net, ConfiguredNet], ids=["no_get_config", "get_config"])
def test_built_subclassed_instance_is_moved_into_the_scope_as_the_same_object(mirrored, cls):
    """Built outside the scope, with or without get_config: kept, its variables moved."""
    model = cls(units=3)
    model(np.zeros((2, 6), "float32"))
    before = model.get_weights()
    trainer = tfdist.Trainer(model, strategy=mirrored, optimizer="sgd", loss=LOSS)
    assert trainer.model is model and model.units == 3
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    _fits(trainer)


def test_auto_precision_keeps_a_made_models_policy(mirrored):
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
    trainer = tfdist.Trainer(model, strategy=mirrored, optimizer="sgd", loss=LOSS, precision="auto")
    assert trainer.precision == "float32"
