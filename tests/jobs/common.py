"""Tiny model and data shared by the multi-process test jobs and their in-process references."""

import keras
import numpy as np
import tensorflow as tf

GLOBAL_BATCH = 16


def data(n=96, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype("float32")
    y = (x @ rng.normal(size=(6, 3))).argmax(1).astype("int32")
    return x, y


def dataset(n=96, global_batch=GLOBAL_BATCH):
    return tf.data.Dataset.from_tensor_slices(data(n)).batch(global_batch)


def collectives_in_loop_body(tf_function):
    """Counts all-reduce ops in the while-loop body of a traced train function.

    The body runs once per optimizer update; the logs read after the loop
    (metric reductions) are outside it. Returns float (gradient) and integer
    (step-counter synchronisation) collectives separately.
    """
    from tensorflow.core.framework import types_pb2

    from tfdist._compat.keras_internals.keras_training import concrete_functions

    counts = {"float": 0, "int": 0}
    for concrete in concrete_functions(tf_function):
        for f in concrete.graph.as_graph_def().library.function:
            if "while_body" not in f.signature.name:
                continue
            for n in f.node_def:
                if n.op in ("CollectiveReduceV2", "CollectiveReduce", "NcclAllReduce"):
                    kind = (
                        "int"
                        if n.attr["T"].type in (types_pb2.DT_INT32, types_pb2.DT_INT64)
                        else "float"
                    )
                    counts[kind] += 1
    return counts


def _with_weights(make, weights):
    """A builder: ``make()``'s model, given ``weights`` when they are not None."""

    def build():
        m = make()
        if weights is not None:
            m.set_weights(weights)
        return m

    return build


def builder(weights=None):
    def make():
        return keras.Sequential(
            [keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)]
        )

    return _with_weights(make, weights)


def initial_weights():
    keras.utils.set_random_seed(1)
    return builder()().get_weights()


#: The modes of tests/jobs/mwms_job.py that train `nested_builder`'s model on `token_dataset`.
NESTED_MODES = ("trainer_zero3_accum",)
VOCAB = 10


def token_dataset(n=96, global_batch=GLOBAL_BATCH):
    """`data`'s examples as 6 token ids each (each feature cut into 10 bins), its labels."""
    x, y = data(n)
    ids = np.clip(np.floor((x + 2.5) * 2), 0, VOCAB - 1).astype("int32")
    return tf.data.Dataset.from_tensor_slices((ids, y)).batch(global_batch)


def nested_builder(weights=None):
    """A functional model inside a functional model, as a KerasHub backbone sits inside its
    task: the inner one embeds the token ids and runs a Dense over the 3-D sequence, the outer
    one pools it and classifies."""

    def make():
        ids = keras.Input((6,), dtype="int32")
        h = keras.layers.Dense(8, activation="tanh")(keras.layers.Embedding(VOCAB, 4)(ids))
        backbone = keras.Model(ids, h, name="backbone")
        task_ids = keras.Input((6,), dtype="int32")
        pooled = keras.layers.GlobalAveragePooling1D()(backbone(task_ids))
        return keras.Model(task_ids, keras.layers.Dense(3)(pooled))

    return _with_weights(make, weights)


def nested_initial_weights():
    keras.utils.set_random_seed(1)
    return nested_builder()().get_weights()
