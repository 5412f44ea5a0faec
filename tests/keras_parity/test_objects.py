"""The user's objects, kept: the catalogues of rows_objects.py are complete, and what parity
rows cannot see (predictions before training; a schedule under tfdist's warmup).

The parity rows themselves (``preprocessing_adapted_instance``, ``metrics_catalogue``,
``schedule_without_get_config``) run in test_parity*.py with the other rows.
"""

import keras
import numpy as np
import tensorflow as tf

import tfdist
from tests.keras_parity import rows_objects
from tests.keras_parity.rows_basic import arrays, mlp


def _classes_with(module, method, base):
    return sorted(
        name
        for name, value in vars(module).items()
        if isinstance(value, type) and issubclass(value, base) and hasattr(value, method)
    )


def test_catalogues_cover_every_keras_metric_and_adapted_layer():
    """Every keras.metrics class is compiled in metrics_catalogue (or skipped, with a reason);
    every layer with ``adapt`` is in preprocessing_adapted_instance."""
    compiled = {
        type(m).__name__ for metrics in rows_objects.catalogue_metrics().values() for m in metrics
    }
    covered = compiled | set(rows_objects.SKIPPED) | set(rows_objects.PER_BATCH)
    missing = [
        n
        for n in _classes_with(keras.metrics, "update_state", keras.metrics.Metric)
        if n not in covered
    ]
    assert not missing, f"keras {keras.__version__}: add {missing} to rows_objects.py"
    adapted = _classes_with(keras.layers, "adapt", keras.layers.Layer)
    adapted += _classes_with(keras.utils, "adapt", keras.layers.Layer)
    assert sorted(set(adapted)) == sorted(rows_objects.ADAPTED_LAYERS)
    model_layers = {type(layer).__name__ for layer in rows_objects.preprocessing_model().layers}
    assert set(rows_objects.ADAPTED_LAYERS) - {"FeatureSpace"} <= model_layers


def test_adapted_instance_predicts_as_the_users_model_before_training(mirrored):
    """Adapted Normalization, Discretization, lookups, TextVectorization, FeatureSpace: moved
    into the scope unchanged (the Trainer's model is the user's object)."""
    model = rows_objects.preprocessing_model()
    x, _ = rows_objects.raw_features()
    before = model(x)  # eager calls: no predict function to trace
    trainer = tfdist.Trainer(model, strategy=mirrored, optimizer="sgd", loss="mse")
    assert trainer.model is model
    assert all(mirrored.extended.variable_created_in_scope(v.value) for v in model.variables)
    np.testing.assert_allclose(model(x), before, atol=1e-6, rtol=0)


def test_schedule_without_get_config_under_warmup(mirrored):
    """tfdist's warmup wraps the user's live schedule: after warmup, the rate is the schedule's."""
    schedule = rows_objects.Halving(0.2, every=3)
    trainer = tfdist.Trainer(
        mlp,
        strategy=mirrored,
        optimizer=keras.optimizers.SGD(schedule),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        warmup_steps=2,
    )
    assert trainer.learning_rate_schedule.base is schedule
    x, y, _ = arrays()
    history = trainer.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), verbose=0)
    updates = int(trainer.model.optimizer.iterations.numpy())
    assert updates == 6
    np.testing.assert_allclose(history.history["learning_rate"][-1], 0.2 * 0.5 ** (updates // 3))
