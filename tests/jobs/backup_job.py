"""A training program for backup/restore and preemption tests.

    [tfdist launch --workers=2 [--max_restarts=1] --] python tests/jobs/backup_job.py \\
        STRATEGY OUT_DIR BACKUP_DIR [--die_at=BATCH | --sigterm_at=BATCH] [--die_task=worker-1]

Trains a small MLP (with a counter of replica steps) on synthetic data with
Trainer(backup_dir=..., backup_freq=2) under op determinism. With --die_at,
DIE_TASK's first attempt calls os._exit(3) after global batch BATCH; with
--sigterm_at it sends itself SIGTERM there (a preemption notice). Each
task writes OUT_DIR/<task>.npz (weights) and OUT_DIR/<task>.json.
"""

import argparse
import json
import os
import pathlib
import signal
import time

parser = argparse.ArgumentParser()
parser.add_argument("strategy")
parser.add_argument("out_dir")
parser.add_argument("backup_dir")
parser.add_argument("--die_at", type=int, default=-1)
parser.add_argument("--die_task", default="worker-1")
parser.add_argument(
    "--sleep", type=float, default=0.0, help="seconds to sleep per batch (to be preempted)"
)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument(
    "--sigterm_at", type=int, default=-1, help="DIE_TASK's first attempt SIGTERMs itself"
)
args = parser.parse_args()

out = pathlib.Path(args.out_dir)
tf_config = json.loads(os.environ.get("TF_CONFIG", '{"task": {"type": "worker", "index": 0}}'))
task = f"{tf_config['task']['type']}-{tf_config['task']['index']}"
attempts = out / f"{task}.attempts"
attempt = int(attempts.read_text()) + 1 if attempts.exists() else 1
attempts.write_text(str(attempt))
(out / f"{task}.pid").write_text(str(os.getpid()))

import logging  # noqa: E402

import tfdist  # noqa: E402

logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
logging.getLogger("tfdist.training.backup").setLevel(logging.INFO)

strategy = tfdist.make_strategy(
    args.strategy, **({"num_devices": 2} if args.strategy == "mirrored" else {})
)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.experimental.enable_op_determinism()


class StepCounter(keras.layers.Layer):
    """Counts replica steps: +1 per replica per training call (summed over replicas)."""

    def build(self, input_shape):
        self.count = self.add_weight(
            shape=(), initializer="zeros", trainable=False, aggregation="sum", name="count"
        )

    def call(self, x, training=False):
        if training:
            self.count.assign_add(1.0)
        return x


def build():
    keras.utils.set_random_seed(7)
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Flatten(),
            StepCounter(),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(10),
        ]
    )


class Die(keras.callbacks.Callback):
    seen = 0

    def on_train_batch_end(self, batch, logs=None):
        Die.seen += 1
        if args.sleep:
            time.sleep(args.sleep)
        if task == args.die_task and attempt == 1 and Die.seen - 1 == args.die_at:
            print(f"{task} dying after batch {Die.seen - 1}", flush=True)
            os._exit(3)
        if task == args.die_task and attempt == 1 and Die.seen - 1 == args.sigterm_at:
            print(f"{task} receives SIGTERM after batch {Die.seen - 1}", flush=True)
            os.kill(os.getpid(), signal.SIGTERM)


trainer = tfdist.Trainer(
    build,
    strategy=strategy,
    optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    backup_dir=args.backup_dir,
    backup_freq=2,
)
train = tfdist.data.load("synthetic", num_examples=512)
trainer.fit(train, epochs=args.epochs, global_batch_size=32, callbacks=[Die()], verbose=0)
counter = next(v for v in trainer.model.non_trainable_variables if "count" in v.path)
np.savez(out / f"{task}.npz", *trainer.model.get_weights())
(out / f"{task}.json").write_text(
    json.dumps(
        {
            "attempt": attempt,
            "iterations": int(trainer.model.optimizer.iterations.numpy()),
            "counter": float(counter.numpy()),
            "replicas": strategy.num_replicas_in_sync,
        }
    )
)
print("finished", task, "attempt", attempt, flush=True)
