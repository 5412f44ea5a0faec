"""Models that bring their own steps or their own compile, against plain Keras on one device.

A GAN (two optimizers set in its own ``compile``), a custom ``predict_step``, a model the user
compiled, a KerasHub task that compiled itself when made (given the Trainer's compile
arguments); and the refusals: tfdist features that a custom ``train_step`` would skip, and a
compiled model given compile arguments again.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.keras_parity.parity import ATOL, fixed_weights
from tests.keras_parity.rows_basic import arrays, mlp, sgd_compile
from tests.keras_parity.rows_overrides import CustomStep, built

LATENT, FEATURES = 4, 6


class GAN(keras.Model):
    """The Keras guide's GAN, with the latent vectors given in the data (deterministic)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.generator = keras.Sequential([keras.Input((LATENT,)), keras.layers.Dense(FEATURES)])
        self.discriminator = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1)])
        self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
        self.g_loss_tracker = keras.metrics.Mean(name="g_loss")

    def compile(self, d_optimizer, g_optimizer):
        super().compile()
        self.d_optimizer, self.g_optimizer = d_optimizer, g_optimizer
        self.loss_fn = keras.losses.BinaryCrossentropy(
            from_logits=True, reduction="sum_over_batch_size"
        )

    @property
    def metrics(self):
        return [self.d_loss_tracker, self.g_loss_tracker]

    def _mean_loss(self, labels, logits):
        # In a replica, a Keras loss divides its mean by the replica count (so the all-reduced
        # gradients are the global mean's); the count turns it back into the mean, for the logs.
        return self.loss_fn(
            labels, logits
        ), tf.distribute.get_replica_context().num_replicas_in_sync

    def train_step(self, data):
        real, latent = data
        n = tf.shape(real)[0]
        fake = self.generator(latent)
        images = tf.concat([fake, real], axis=0)
        labels = tf.concat([tf.ones((n, 1)), tf.zeros((n, 1))], axis=0)
        with tf.GradientTape() as tape:
            d_loss, replicas = self._mean_loss(labels, self.discriminator(images))
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply(grads, self.discriminator.trainable_weights)
        with tf.GradientTape() as tape:
            g_loss, _ = self._mean_loss(
                tf.zeros((n, 1)), self.discriminator(self.generator(latent))
            )
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply(grads, self.generator.trainable_weights)
        self.d_loss_tracker.update_state(d_loss * replicas)
        self.g_loss_tracker.update_state(g_loss * replicas)
        return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}


def compiled_gan():
    keras.utils.set_random_seed(2)
    gan = GAN()
    gan.compile(keras.optimizers.SGD(0.05), keras.optimizers.SGD(0.02))
    return gan


def gan_data():
    rng = np.random.default_rng(3)
    real = rng.standard_normal((64, FEATURES)).astype("float32")
    latent = rng.standard_normal((64, LATENT)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((real, latent)).batch(16)


def assert_close(got, want):
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=ATOL, rtol=0)


def test_gan_with_two_optimizers_compiled_in_the_scope_matches_keras(mirrored):
    reference = compiled_gan()
    expected = reference.fit(gan_data(), epochs=2, verbose=0).history
    strategy = mirrored
    with strategy.scope():
        gan = compiled_gan()
    trainer = tfdist.Trainer(gan, strategy=strategy)
    history = trainer.fit(gan_data(), epochs=2, verbose=0).history
    assert sorted(history) == ["d_loss", "g_loss"]
    for key in history:
        np.testing.assert_allclose(history[key], expected[key], atol=ATOL, rtol=0)
    assert_close(trainer.model.get_weights(), reference.get_weights())
    # A builder runs in the scope, so it may compile its model there too.
    built_there = tfdist.Trainer(compiled_gan, strategy=strategy)
    assert built_there.fit(gan_data(), epochs=2, verbose=0).history == history


def test_gan_compiled_outside_the_scope_is_refused(mirrored):
    with pytest.raises(ValueError, match=r"argument `model`.*overrides compile\(\).*scope"):
        tfdist.Trainer(compiled_gan(), strategy=mirrored)


def test_uncompiled_model_with_its_own_compile_is_refused(mirrored):
    with pytest.raises(ValueError, match=r"argument `model`.*has its own compile\(\)"):
        tfdist.Trainer(GAN(), strategy=mirrored, loss="mse")


def test_predict_step_override_gives_keras_outputs(mirrored):
    x, y, _ = arrays()
    keras.utils.set_random_seed(0)
    reference = built(CustomStep)()
    reference.compile(**sgd_compile())
    expected = reference.predict(x, batch_size=16, verbose=0)
    trainer = tfdist.Trainer(built(CustomStep), strategy=mirrored, **sgd_compile())
    got = trainer.predict(x, global_batch_size=16)
    np.testing.assert_allclose(got, expected, atol=1e-6)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, atol=1e-5)  # its softmax, not the logits


def test_compiled_model_gives_its_optimizer_loss_and_metrics(mirrored):
    x, y, _ = arrays()
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    reference = mlp()
    reference.compile(**sgd_compile())
    expected = reference.fit(data, epochs=2, verbose=0).history
    model = mlp()
    model.compile(**sgd_compile())  # outside the scope: rebuilt in it, compile arguments kept
    trainer = tfdist.Trainer(model, strategy=mirrored)
    history = trainer.fit(data, epochs=2, verbose=0).history
    assert sorted(history) == sorted(expected) == ["accuracy", "loss"]
    for key in expected:
        np.testing.assert_allclose(history[key], expected[key], atol=ATOL, rtol=0)
    assert_close(trainer.model.get_weights(), reference.get_weights())
    assert isinstance(trainer.model.optimizer, keras.optimizers.SGD)


@pytest.mark.parametrize("argument", ["optimizer", "loss", "metrics", "loss_weights"])
def test_compiled_model_with_compile_arguments_is_refused(argument, mirrored):
    model = mlp()
    model.compile(**sgd_compile())
    value = {"optimizer": "adam", "loss": "mse", "metrics": ["mae"], "loss_weights": [1.0]}
    with pytest.raises(ValueError, match=rf"argument `{argument}`.*already compiled.*not both"):
        tfdist.Trainer(model, strategy=mirrored, **{argument: value[argument]})


def gpt2_task():
    """KerasHub's GPT2CausalLM from its constructor (random weights, no download), made outside
    any scope: it compiles itself (Adam, its loss, an accuracy). Dropout off: its randomness
    differs between any two runs."""
    import keras_hub

    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=50,
        num_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=16,
        dropout=0.0,
    )
    return fixed_weights(keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None))


@pytest.mark.slow
def test_a_task_that_compiled_itself_trains_with_the_trainers_compile_arguments(mirrored):
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 50, (32, 9)).astype("int32")
    x = {"token_ids": ids[:, :-1], "padding_mask": np.ones((32, 8), "int32")}
    fit = dict(x=x, y=ids[:, 1:], batch_size=8, epochs=2, shuffle=False, verbose=0)
    reference = gpt2_task()
    assert reference.compiled  # by its constructor; the user compiles it again, in plain Keras
    reference.compile(**lm_compile())
    expected = reference.fit(**fit).history
    task = gpt2_task()
    trainer = tfdist.Trainer(task, strategy=mirrored, **lm_compile())
    history = trainer.fit(**fit).history
    assert sorted(history) == sorted(expected) == ["loss", "sparse_categorical_accuracy"]
    for key in expected:
        np.testing.assert_allclose(history[key], expected[key], atol=ATOL, rtol=0)
    assert trainer.model is task and isinstance(task.optimizer, keras.optimizers.SGD)
    assert_close(task.get_weights(), reference.get_weights())


def test_a_task_that_compiled_itself_outside_the_scope_says_to_pass_compile_arguments(mirrored):
    with pytest.raises(ValueError, match=r"argument `model`.*pass its compile arguments to the"):
        tfdist.Trainer(gpt2_task(), strategy=mirrored)


def lm_compile():
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return dict(optimizer=keras.optimizers.SGD(0.1), loss=loss)


@pytest.mark.parametrize(
    "option, value",
    [("accumulation_steps", 2), ("gradient_compression", "bf16"), ("bucket_bytes", 1024)],
)
def test_custom_train_step_refuses_what_it_would_skip(option, value, mirrored):
    with pytest.raises(ValueError, match=rf"argument `{option}`.*overrides train_step\(\)"):
        tfdist.Trainer(built(CustomStep), strategy=mirrored, **sgd_compile(), **{option: value})


def test_uncompiled_model_without_loss_is_refused(mirrored):
    # Accepted as Keras's compile(loss=None) accepts it; refused once a batch shows the model
    # adds no loss of its own (add_loss), before anything trains.
    trainer = tfdist.Trainer(mlp, strategy=mirrored, optimizer="sgd")
    x, y, _ = arrays()
    with pytest.raises(ValueError, match=r"argument `loss`.*Received: loss=None.*add_loss"):
        trainer.fit(x, y, batch_size=16, verbose=0)
    assert int(trainer.model.optimizer.iterations.numpy()) == 0


def test_train_step_returning_no_dict_is_refused(mirrored):
    class NoDict(CustomStep):
        def train_step(self, data):
            super().train_step(data)
            return 1.0

    trainer = tfdist.Trainer(built(NoDict), strategy=mirrored, **sgd_compile())
    x, y, _ = arrays()
    with pytest.raises(ValueError, match=r"train_step\(\) return value"):
        trainer.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), verbose=0)


class Hooks(keras.callbacks.Callback):
    """Records the test and predict hooks it sees."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_test_begin(self, logs=None):
        self.seen.append("test_begin")

    def on_test_end(self, logs=None):
        self.seen.append(("test_end", round(float(logs["loss"]), 5)))

    def on_predict_begin(self, logs=None):
        self.seen.append("predict_begin")

    def on_predict_batch_end(self, batch, logs=None):
        self.seen.append(("predict_batch", batch, len(logs["outputs"])))

    def on_predict_end(self, logs=None):
        self.seen.append("predict_end")


def test_evaluate_and_predict_run_callbacks_as_keras(mirrored):
    x, y, _ = arrays()
    reference = mlp()
    reference.compile(**sgd_compile())
    trainer = tfdist.Trainer(mlp, strategy=mirrored, **sgd_compile())
    want, got = Hooks(), Hooks()
    reference.evaluate(x, y, batch_size=40, callbacks=[want], verbose=0)
    trainer.evaluate(x, y, batch_size=40, callbacks=[got])
    reference.predict(x, batch_size=40, callbacks=[want], verbose=0)
    trainer.predict(x, batch_size=40, callbacks=[got])
    assert got.seen == want.seen  # batches of 40, 40 and 16
