"""Parity rows for the objects a user built: kept as they are, not rebuilt from their config.

* ``preprocessing_adapted_instance``: a model with every Keras preprocessing layer that has
  ``adapt`` (one input branch each), adapted and built outside the strategy scope and given to
  the Trainer as that instance (``Row.instance``): its adapted state and lookup tables must
  survive, and the user's object must hold the trained weights.
* ``metrics_catalogue``: every metric class in ``keras.metrics`` (:data:`SKIPPED` says why a
  few are not compile metrics), with non-default constructor arguments, plus custom ``Metric``
  subclasses with and without ``get_config`` (one with a required argument), on one model.
* ``schedule_without_get_config``: a ``LearningRateSchedule`` subclass with no ``get_config``,
  in an optimizer subclass whose required argument its config does not list.
"""

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from tests.keras_parity.parity import Row
from tests.keras_parity.rows_basic import arrays, mlp

N = 64
FS = keras.utils.FeatureSpace


def raw_features(seed=0, n=N):
    """Raw features for every preprocessing branch, and a regression target."""
    rng = np.random.default_rng(seed)
    num = (rng.standard_normal((n, 3)) * 5 + 3).astype("float32")
    x = {
        "num": num,
        "disc": num[:, :2] * 0.7,
        "word": np.array(["a", "b", "c", "d", "e"])[rng.integers(0, 5, (n, 1))],
        "int": rng.integers(0, 7, (n, 1)).astype("int64"),
        "text": np.array([" ".join(rng.choice(["x", "y", "z", "w"], 3)) for _ in range(n)]),
        "fs_f": num[:, 2:] * 2.0,
        "fs_w": np.array(["p", "q", "r"])[rng.integers(0, 3, (n, 1))],
    }
    return x, rng.standard_normal((n, 2)).astype("float32")


#: Every layer class in keras.layers with an ``adapt`` method, and the branch that holds it.
ADAPTED_LAYERS = {
    "Normalization": "num",
    "Discretization": "disc",
    "StringLookup": "word",
    "IntegerLookup": "int",
    "TextVectorization": "text",
    "FeatureSpace": "fs_f, fs_w",  # keras.utils; its model is get_inputs() -> its encodings
}


def _feature_space(x):
    space = FS(
        features={"fs_f": FS.float_normalized(), "fs_w": FS.string_categorical()},
        output_mode="concat",
    )
    space.adapt(tf.data.Dataset.from_tensor_slices({"fs_f": x["fs_f"], "fs_w": x["fs_w"]}))
    return space


def preprocessing_model():
    """Every adapted layer on its own input, adapted here (outside any strategy scope)."""
    x, _ = raw_features()
    inputs = {
        "num": keras.Input((3,), name="num"),
        "disc": keras.Input((2,), name="disc"),
        "word": keras.Input((1,), dtype="string", name="word"),
        "int": keras.Input((1,), dtype="int64", name="int"),
        "text": keras.Input((), dtype="string", name="text"),
    }
    layers = {
        "num": keras.layers.Normalization(),
        "disc": keras.layers.Discretization(num_bins=4, output_mode="one_hot"),
        "word": keras.layers.StringLookup(output_mode="one_hot"),
        "int": keras.layers.IntegerLookup(output_mode="one_hot"),
        "text": keras.layers.TextVectorization(output_mode="count"),
    }
    parts = []
    for key, layer in layers.items():
        layer.adapt(x[key])
        parts.append(keras.layers.Flatten()(layer(inputs[key])))
    space = _feature_space(x)
    inputs.update(space.get_inputs())
    parts.append(space.get_encoded_features())
    joined = keras.layers.Concatenate()(parts)
    head = keras.layers.Dense(2)
    model = keras.Model(inputs, head(joined))
    rng = np.random.default_rng(1)  # only the head: the adapted state stays as adapted
    head.set_weights([0.3 * rng.standard_normal(w.shape).astype("float32") for w in head.weights])
    return model


def preprocessing_data():
    x, y = raw_features()
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16)


def regression_compile():
    return dict(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"])


# --- metrics ---------------------------------------------------------------------------------


class ThresholdHits(keras.metrics.Metric):
    """A required constructor argument, and no get_config: Keras's default lists only the name."""

    def __init__(self, threshold, name="threshold_hits", **kwargs):
        super().__init__(name=name, **kwargs)
        self.threshold = threshold
        self.hits = self.add_variable((), initializer="zeros", name="hits", aggregation="sum")
        self.total = self.add_variable((), initializer="zeros", name="total", aggregation="sum")

    def update_state(self, y_true, y_pred, sample_weight=None):
        above = ops.cast(ops.greater(y_pred, self.threshold), "float32")
        self.hits.assign_add(ops.sum(ops.cast(ops.equal(above, y_true), "float32")))
        self.total.assign_add(ops.cast(ops.size(y_true), "float32"))

    def result(self):
        return ops.divide_no_nan(self.hits, self.total)


class ScaledAbsError(keras.metrics.Metric):
    """A required constructor argument, listed in its own get_config."""

    def __init__(self, scale, name="scaled_abs_error", **kwargs):
        super().__init__(name=name, **kwargs)
        self.scale = scale
        self.sum = self.add_variable((), initializer="zeros", name="sum", aggregation="sum")
        self.count = self.add_variable((), initializer="zeros", name="count", aggregation="sum")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.sum.assign_add(self.scale * ops.sum(ops.abs(y_true - y_pred)))
        self.count.assign_add(ops.cast(ops.size(y_true), "float32"))

    def result(self):
        return ops.divide_no_nan(self.sum, self.count)

    def get_config(self):
        return {**super().get_config(), "scale": self.scale}


def mean_abs_diff(y_true, y_pred):
    return ops.mean(ops.abs(y_true - y_pred), axis=-1)


#: Metrics whose result is a mean of per-batch values that are not sums (a correlation per
#: batch): on N replicas each replica's batch is a part of Keras's, so they cannot equal one
#: device; the catalogue leaves them out (on mirrored x2 both were 0.03 off).
PER_BATCH = ("PearsonCorrelation", "ConcordanceCorrelation")

#: keras.metrics classes that are not compile metrics of (y_true, y_pred), and why.
SKIPPED = {
    "Metric": "the abstract base: ThresholdHits and ScaledAbsError stand for it",
    "Mean": "update_state(values, sample_weight): no (y_true, y_pred), so not a compile metric",
    "Sum": "update_state(values, sample_weight): no (y_true, y_pred), so not a compile metric",
}


def catalogue_metrics():
    """Per output, a fresh instance of every compile metric, non-default arguments where any.

    Metrics that Keras names with a counter ("auc_1" for the second AUC in a process) are
    named here, so that Keras's run and the Trainer's log the same keys.
    """
    m = keras.metrics
    binary = [
        m.AUC(num_thresholds=20, curve="PR", name="auc"),
        m.BinaryAccuracy(threshold=0.6),
        m.BinaryCrossentropy(label_smoothing=0.1),
        m.BinaryIoU(target_class_ids=[1], threshold=0.4, name="binary_iou"),
        m.F1Score(average="micro", threshold=0.4),
        m.FBetaScore(average="micro", beta=2.0, threshold=0.4),
        m.FalseNegatives(thresholds=0.3, name="false_negatives"),
        m.FalsePositives(thresholds=0.4, name="false_positives"),
        m.TrueNegatives(thresholds=0.6, name="true_negatives"),
        m.TruePositives(thresholds=0.7, name="true_positives"),
        m.Precision(thresholds=0.6, name="precision"),
        m.Recall(thresholds=0.4, name="recall"),
        m.PrecisionAtRecall(recall=0.5, num_thresholds=20, name="precision_at_recall"),
        m.RecallAtPrecision(precision=0.6, num_thresholds=20, name="recall_at_precision"),
        m.SensitivityAtSpecificity(
            specificity=0.5, num_thresholds=20, name="sensitivity_at_specificity"
        ),
        m.SpecificityAtSensitivity(
            sensitivity=0.5, num_thresholds=20, name="specificity_at_sensitivity"
        ),
        m.Hinge(),
        m.SquaredHinge(),
        m.Accuracy(),
        ThresholdHits(0.9),
    ]
    categorical = [
        m.CategoricalAccuracy(),
        m.CategoricalCrossentropy(label_smoothing=0.1),
        m.CategoricalHinge(),
        m.TopKCategoricalAccuracy(k=2),
        m.OneHotIoU(num_classes=3, target_class_ids=[0, 2], name="one_hot_iou"),
        m.OneHotMeanIoU(num_classes=3, name="one_hot_mean_iou"),
    ]
    sparse = [
        m.SparseCategoricalAccuracy(),
        m.SparseCategoricalCrossentropy(axis=-1),
        m.SparseTopKCategoricalAccuracy(k=2),
        m.IoU(num_classes=3, target_class_ids=[1], sparse_y_pred=False, name="iou"),
        m.MeanIoU(num_classes=3, sparse_y_pred=False, name="mean_iou"),
    ]
    regression = [
        m.MeanAbsoluteError(),
        m.MeanAbsolutePercentageError(),
        m.MeanSquaredError(),
        m.MeanSquaredLogarithmicError(),
        m.RootMeanSquaredError(),
        m.CosineSimilarity(axis=-1),
        m.LogCoshError(),
        m.R2Score(class_aggregation="variance_weighted_average"),
        m.Poisson(),
        m.KLDivergence(),
        m.MeanMetricWrapper(mean_abs_diff, name="mean_abs_diff"),
        ScaledAbsError(3.0),
    ]
    return dict(bin=binary, cat=categorical, sparse=sparse, reg=regression)


def four_heads():
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="tanh")(inputs)
    outputs = {
        "bin": keras.layers.Dense(1, activation="sigmoid", name="bin")(hidden),
        "cat": keras.layers.Dense(3, activation="softmax", name="cat")(hidden),
        "sparse": keras.layers.Dense(3, activation="softmax", name="sparse")(hidden),
        "reg": keras.layers.Dense(2, activation="softplus", name="reg")(hidden),
    }
    model = keras.Model(inputs, outputs)
    rng = np.random.default_rng(1)
    model.set_weights([0.3 * rng.standard_normal(w.shape).astype("float32") for w in model.weights])
    return model


def metrics_compile():
    return dict(
        optimizer=keras.optimizers.SGD(0.1),
        loss=dict(
            bin="binary_crossentropy",
            cat="categorical_crossentropy",
            sparse="sparse_categorical_crossentropy",
            reg="mse",
        ),
        metrics=catalogue_metrics(),
    )


def metrics_data():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((N, 6)).astype("float32")
    cls = rng.integers(0, 3, N)
    y = dict(
        bin=(x[:, :1] > 0).astype("float32"),
        cat=np.eye(3, dtype="float32")[cls],
        sparse=cls.astype("int32"),
        reg=rng.uniform(0.5, 2.0, (N, 2)).astype("float32"),
    )
    return dict(x=tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=2)


# --- a schedule without get_config -----------------------------------------------------------


class Halving(keras.optimizers.schedules.LearningRateSchedule):
    """Halves the rate every ``every`` updates; no get_config (Keras trains it all the same)."""

    def __init__(self, initial, every):
        self.initial = initial
        self.every = every

    def __call__(self, step):
        halvings = ops.floor(ops.cast(step, "float32") / self.every)
        return self.initial * ops.power(0.5, halvings)


class DampedSGD(keras.optimizers.SGD):
    """An optimizer subclass with a required argument its config does not list."""

    def __init__(self, learning_rate, damping, **kwargs):
        super().__init__(learning_rate, **kwargs)
        self.damping = damping

    def update_step(self, gradient, variable, learning_rate):
        super().update_step(gradient * self.damping, variable, learning_rate)


def halving_compile():
    return dict(
        optimizer=DampedSGD(Halving(0.4, every=3), damping=0.5),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )


def _classes_fit():
    x, y, _ = arrays()
    return dict(x=tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=2)


ROWS = [
    Row(
        "preprocessing_adapted_instance",
        preprocessing_model,
        regression_compile,
        lambda: dict(x=preprocessing_data(), epochs=2),
        instance=True,
    ),
    Row("metrics_catalogue", four_heads, metrics_compile, metrics_data),
    Row("schedule_without_get_config", mlp, halving_compile, _classes_fit),
]
