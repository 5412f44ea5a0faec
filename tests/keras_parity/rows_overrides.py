"""Parity rows for models with their own ``train_step`` (the Keras guide's patterns)."""

import keras
import tensorflow as tf

from tests.keras_parity.parity import Row, fixed_weights
from tests.keras_parity.rows_basic import CLASSES, FEATURES, arrays, dataset_fit, sgd_compile


class SuperStep(keras.Model):
    """``super().train_step(data)`` with extra work: counts its steps in a metric."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(8, activation="relu")
        self.out = keras.layers.Dense(CLASSES)
        self.steps_seen = keras.metrics.Sum(name="steps_seen")

    def call(self, x):
        return self.out(self.hidden(x))

    def train_step(self, data):
        logs = super().train_step(data)
        self.steps_seen.update_state(1.0)
        return {**logs, "steps_seen": self.steps_seen.result()}


class CustomStep(keras.Model):
    """A fully custom step: ``compute_loss``, ``optimizer.apply``, its own trackers; a
    custom ``test_step`` and ``predict_step`` too."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(8, activation="relu")
        self.out = keras.layers.Dense(CLASSES)
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.acc = keras.metrics.SparseCategoricalAccuracy(name="acc")

    def call(self, x):
        return self.out(self.hidden(x))

    @property
    def metrics(self):
        return [self.loss_tracker, self.acc]

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            # A loss of its own (half the compiled one) to see that this step is the one used.
            loss = 0.5 * self.compute_loss(y=y, y_pred=y_pred)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(grads, self.trainable_variables)
        # compute_loss divides by the replica count (Keras, under any strategy); log the mean.
        replicas = tf.distribute.get_replica_context().num_replicas_in_sync
        self.loss_tracker.update_state(loss * replicas)
        self.acc.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}

    def test_step(self, data):
        x, y = data
        y_pred = self(x, training=False)
        replicas = tf.distribute.get_replica_context().num_replicas_in_sync
        self.loss_tracker.update_state(self.compute_loss(y=y, y_pred=y_pred) * replicas)
        self.acc.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}

    def predict_step(self, data):
        x = data[0] if isinstance(data, tuple) else data
        return tf.nn.softmax(self(x, training=False))


def built(cls):
    def make():
        model = cls()
        model(tf.zeros((1, FEATURES)))  # a subclass without build(): a call makes its weights
        return fixed_weights(model)

    return make


def with_validation():
    fit = dataset_fit()()
    x, y, _ = arrays(seed=5)
    fit["validation_data"] = tf.data.Dataset.from_tensor_slices((x[:40], y[:40])).batch(16)
    return fit


ROWS = [
    Row("train_step_super", built(SuperStep), sgd_compile, dataset_fit()),
    Row("train_step_custom", built(CustomStep), sgd_compile, with_validation),
]


class OwnLoss(keras.Model):
    """A ``compute_loss`` override (tfdist's own step calls it): half the compiled loss plus an
    output penalty made with a Keras loss (which divides by the replica count, as compile's)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(8, activation="relu")
        self.out = keras.layers.Dense(CLASSES)
        self.penalty = keras.losses.MeanSquaredError()

    def call(self, x):
        return self.out(self.hidden(x))

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        loss = super().compute_loss(x, y, y_pred, sample_weight, training=training)
        return 0.5 * loss + 0.1 * self.penalty(tf.zeros_like(y_pred), y_pred)


ROWS.append(Row("compute_loss_override", built(OwnLoss), sgd_compile, dataset_fit()))
