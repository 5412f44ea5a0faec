"""Training functions that run inside Ray Train workers (imported there by reference).

Each is a user's function: it uses only tfdist's public API (and Ray's), as
one would pass to ``tfdist.launch.ray_launcher`` or ``TensorflowTrainer``.
"""

import hashlib
import json
import os
import time

import numpy as np


def _digest(weights):
    h = hashlib.sha256()
    for w in weights:
        h.update(np.ascontiguousarray(w).tobytes())
    return h.hexdigest()


def several(reference_dir, digits_epochs, ray_data_epochs):
    """Three jobs on one worker group (sharing it saves two group start-ups, ~70 CPU-seconds).

    The fault test's uninterrupted reference runs first, in a process as fresh as the faulty
    run's; then the Trainer on digits, then the Trainer on the Ray Data shard. One strategy serves
    all three (a process makes its MultiWorkerMirroredStrategy once).
    """
    import tfdist

    strategy = tfdist.make_strategy("multi_worker")
    return {
        "reference": train_with_backups(reference_dir, -1, strategy=strategy),
        "training": train_digits(digits_epochs, strategy=strategy),
        "ray_data": trainer_on_ray_data(ray_data_epochs, strategy=strategy),
    }


def _mlp_trainer(strategy):
    """The Trainer both digits jobs use: the MLP from seed 0, Adam, accuracy."""
    import keras

    import tfdist

    keras.utils.set_random_seed(0)
    return tfdist.Trainer(
        lambda: tfdist.models.get("mlp", input_shape=(8, 8, 1), num_classes=10),
        strategy=strategy,
        optimizer=keras.optimizers.Adam(5e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )


def train_digits(epochs, strategy):
    """The Trainer on digits: returns validation accuracy, a weight digest, TF's thread counts."""
    import tensorflow as tf

    import tfdist

    trainer = _mlp_trainer(strategy)
    history = trainer.fit(
        tfdist.data.load("digits"),
        epochs=epochs,
        global_batch_size=64,
        validation_data=tfdist.data.load("digits", split="validation"),
        verbose=0,
    )
    return {
        "val_accuracy": float(history.history["val_accuracy"][-1]),
        "digest": _digest(trainer.model.get_weights()),
        "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
        "tf_config": json.loads(os.environ["TF_CONFIG"]),
        "replicas": strategy.num_replicas_in_sync,
    }


def train_with_backups(out_dir, die_at, strategy=None):
    """Trainer + RayBackup under op determinism.

    Rank 1's first attempt os._exit's after global batch ``die_at``.

    Each attempt uses a fresh backup_dir, so a resume can only come from Ray's checkpoint.
    """
    import ray.train

    import tfdist
    from tfdist.launch import RayBackup

    rank = ray.train.get_context().get_world_rank()
    attempts = os.path.join(out_dir, f"rank{rank}.attempts")
    attempt = int(open(attempts).read()) + 1 if os.path.exists(attempts) else 1
    with open(attempts, "w") as f:
        f.write(str(attempt))
    strategy = strategy or tfdist.make_strategy("multi_worker")
    import keras
    import tensorflow as tf

    tf.config.experimental.enable_op_determinism()

    def build():
        keras.utils.set_random_seed(7)
        return keras.Sequential(
            [
                keras.Input((8, 8, 1)),
                keras.layers.Flatten(),
                keras.layers.Dense(16, activation="relu"),
                keras.layers.Dense(10),
            ]
        )

    class Die(keras.callbacks.Callback):
        seen = 0

        def on_train_batch_end(self, batch, logs=None):
            Die.seen += 1
            if rank == 1 and attempt == 1 and Die.seen - 1 == die_at:
                with open(os.path.join(out_dir, "killed_at"), "w") as f:
                    f.write(str(time.time()))
                os._exit(3)

    backup = RayBackup(os.path.join(out_dir, f"backup-attempt{attempt}"), backup_freq=2)
    trainer = tfdist.Trainer(
        build,
        strategy=strategy,
        optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        backup_dir=backup.backup_dir,
        backup_freq=2,
    )
    trainer.fit(
        tfdist.data.load("synthetic", num_examples=512),
        epochs=2,
        global_batch_size=32,
        callbacks=[Die(), backup],
        verbose=0,
    )
    return {
        "attempt": attempt,
        "iterations": int(trainer.model.optimizer.iterations.numpy()),
        "weights": trainer.model.get_weights(),
        "restored": backup.restored,
        "restored_at": backup.restored_at,
    }


def ray_quickstart(config):
    """Ray's TensorFlow quickstart flow.

    MWMS, model.fit in the scope, a Ray Data shard, Ray's Keras callback.
    """
    import keras
    import ray.train
    import tensorflow as tf
    from ray.train.tensorflow.keras import ReportCheckpointCallback

    import tfdist  # noqa: F401  (after keras: its shims make Keras 3's model.fit work under MWMS)

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((1,)), keras.layers.Dense(10, activation="relu"), keras.layers.Dense(1)]
        )
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mean_squared_error")
    shard = ray.train.get_dataset_shard("train")
    dataset = shard.to_tf(feature_columns="x", label_columns="y", batch_size=config["batch_size"])
    history = model.fit(
        dataset, epochs=config["epochs"], callbacks=[ReportCheckpointCallback()], verbose=0
    )
    return history.history


def trainer_on_ray_data(epochs, strategy):
    """The Trainer fed by a worker's Ray Data shard (a dataset_fn of per-replica batches)."""
    import ray.train
    import tensorflow as tf

    shard = ray.train.get_dataset_shard("train")

    def dataset_fn(input_context):
        batch = input_context.get_per_replica_batch_size(64)
        ds = shard.to_tf(feature_columns="x", label_columns="y", batch_size=batch)
        return ds.map(lambda x, y: (tf.reshape(tf.cast(x, tf.float32), (-1, 8, 8, 1)), y))

    trainer = _mlp_trainer(strategy)
    history = trainer.fit(dataset_fn, epochs=epochs, steps_per_epoch=10, verbose=0)
    return {
        "accuracy": float(history.history["accuracy"][-1]),
        "digest": _digest(trainer.model.get_weights()),
    }
