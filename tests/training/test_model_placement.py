"""Trainer model placement: subclassed instances, built or not, and `precision="auto"` with a
made model."""

import keras
import numpy as np
import pytest

import tfdist
from tests.jobs.common import dataset
from tfdist.training.placement import created_in_scope

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


def test_built_subclassed_instance_with_get_config_is_rebuilt_with_its_weights(mirrored):
    model = ConfiguredNet(units=3)
    model(np.zeros((2, 6), "float32"))
    trainer = tfdist.Trainer(model, strategy=mirrored, optimizer="sgd", loss=LOSS)
    assert type(trainer.model) is ConfiguredNet and trainer.model is not model
    for a, b in zip(model.get_weights(), trainer.model.get_weights()):
        np.testing.assert_array_equal(a, b)
    _fits(trainer)


def test_built_subclassed_instance_without_get_config_is_a_clear_error(mirrored):
    model = Net(units=3)
    model(np.zeros((2, 6), "float32"))
    with pytest.raises(
        ValueError,
        match=r"argument `model`. Received: model='Net'.*no get_config\(\).*"
        r"`model=lambda: Net\(...\)`",
    ):
        tfdist.Trainer(model, strategy=mirrored, optimizer="sgd", loss=LOSS)


def test_auto_precision_keeps_a_made_models_policy(mirrored):
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
    trainer = tfdist.Trainer(model, strategy=mirrored, optimizer="sgd", loss=LOSS, precision="auto")
    assert trainer.precision == "float32"
