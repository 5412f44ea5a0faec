"""Parity rows for multi-input and multi-output models: datasets and dataset_fns.

Dict inputs and dict outputs, list inputs and list outputs, per-output losses with
``loss_weights``, per-output metrics, sample weights and validation data; a dataset_fn row
gives Keras the dataset of global batches it stands for. 69 training examples
in batches of 16 leave a partial last batch of 5 (3 and 2 on two replicas); 33 validation
examples leave a last batch of 1 (one replica empty).
"""

import keras
import numpy as np
import tensorflow as tf

from tests.keras_parity.parity import Row, fixed_weights

N, N_VAL, G = 69, 33, 16


def arrays(n=N, seed=0):
    """``(x, y, sample_weight)``: x a dict {"a", "b"}, y a dict {"cls", "reg"}."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, 4)).astype("float32")
    b = rng.standard_normal((n, 3)).astype("float32")
    cls = (a[:, 0] > 0).astype("int32") + (b[:, 1] > 0.5).astype("int32")
    reg = (0.5 * a[:, 1:2] - b[:, 0:1]).astype("float32")
    w = rng.uniform(0.5, 2.0, n).astype("float32")
    return {"a": a, "b": b}, {"cls": cls, "reg": reg}, w


def _trunk():
    keras.utils.set_random_seed(1)
    a, b = keras.Input((4,), name="a"), keras.Input((3,), name="b")
    h = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()([a, b]))
    return a, b, keras.layers.Dense(3, name="cls")(h), keras.layers.Dense(1, name="reg")(h)


def dict_model():
    a, b, cls, reg = _trunk()
    return fixed_weights(keras.Model({"a": a, "b": b}, {"cls": cls, "reg": reg}))


def list_model():
    a, b, cls, reg = _trunk()
    return fixed_weights(keras.Model([a, b], [cls, reg]))


def dict_compile():
    return dict(
        optimizer=keras.optimizers.SGD(0.1),
        loss={"cls": keras.losses.SparseCategoricalCrossentropy(from_logits=True), "reg": "mse"},
        loss_weights={"cls": 1.0, "reg": 0.5},
        metrics={"cls": ["accuracy"], "reg": ["mae"]},
    )


def list_compile():
    return dict(
        optimizer=keras.optimizers.SGD(0.1),
        loss=[keras.losses.SparseCategoricalCrossentropy(from_logits=True), "mse"],
        loss_weights=[1.0, 0.5],
        metrics=[["accuracy"], ["mae"]],
    )


def _as_list(x, y):
    return (x["a"], x["b"]), (y["cls"], y["reg"])


def dataset(*, weights=False, lists=False, n=N, seed=0, batch=G):
    x, y, w = arrays(n, seed)
    if lists:
        x, y = _as_list(x, y)
    return tf.data.Dataset.from_tensor_slices((x, y, w) if weights else (x, y)).batch(batch)


def dataset_fit(batch=G, validation=False, epochs=1, **options):
    def fit():
        fit = dict(x=dataset(batch=batch, **options), epochs=epochs)
        if validation:
            fit["validation_data"] = dataset(n=N_VAL, seed=1, lists=options.get("lists", False))
        return fit

    return fit


def dataset_fn_fit(weights=False):
    """A dataset_fn of per-replica batches; its global batches are ``dataset(...)``'s in order."""

    def dataset_fn(input_context):
        x, y, w = arrays()
        ds = tf.data.Dataset.from_tensor_slices((x, y, w) if weights else (x, y))
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        return ds.batch(input_context.get_per_replica_batch_size(G))

    def fit():
        return dict(x=dataset_fn, epochs=1, global_batch_size=G)

    return fit


ROWS = [
    Row(
        "multi_io_dict_dataset",
        dict_model,
        dict_compile,
        dataset_fit(validation=True, epochs=2),
        slow=True,
    ),
    Row(
        "multi_io_list_dataset_sample_weight",
        list_model,
        list_compile,
        dataset_fit(lists=True, weights=True),
    ),
    Row(
        "multi_io_dict_dataset_fn",
        dict_model,
        dict_compile,
        dataset_fn_fit(weights=True),
        keras_fit=lambda: dict(x=dataset(weights=True), epochs=1),
    ),
    Row(
        "multi_io_dict_accumulation",
        dict_model,
        dict_compile,
        dataset_fit(weights=True),
        trainer=dict(accumulation_steps=2),
        keras_fit=dataset_fit(weights=True, batch=2 * G),
        # Keras counts its 2x batches as steps; the Trainer adds its own `updates` log.
        history_keys=("loss", "cls_loss", "reg_loss", "cls_accuracy", "reg_mae"),
        slow=True,
    ),
]
