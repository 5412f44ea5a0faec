"""A training program for backup/restore and preemption tests.

    [tfdist launch --workers=2 [--max_restarts=1] --] python tests/jobs/backup_job.py \\
        STRATEGY OUT_DIR BACKUP_DIR [--die_at=BATCH | --sigterm_at=BATCH] [--die_task=worker-1]
        [--stick_at=UPDATE --stick_in=callback|input|save|frozen] [--watchdog=FLOOR,FACTOR]
        [--slow_input=SECONDS]

Trains a small MLP (with a counter of replica steps) on synthetic data with
Trainer(backup_dir=..., backup_freq=2) under op determinism. With --die_at,
DIE_TASK's first attempt calls os._exit(3) after global batch BATCH; with
--sigterm_at it sends itself SIGTERM there (a preemption notice). With
--stick_at, DIE_TASK's first attempt hangs at that update, alive: blocked in a
callback, in a tf.py_function of its input pipeline, inside a backup save, or
frozen by SIGSTOP. --slow_input sleeps that long per example batch in DIE_TASK's
input pipeline (a straggler). Each task writes OUT_DIR/<task>.npz (weights) and
OUT_DIR/<task>.json.
"""

import argparse
import dataclasses
import json
import os
import pathlib
import signal
import threading
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
parser.add_argument("--stick_at", type=int, default=-1)
parser.add_argument(
    "--stick_in", default="callback", choices=("callback", "input", "save", "frozen")
)
parser.add_argument("--watchdog", default="", help="FLOOR,FACTOR: the watchdog's options")
parser.add_argument("--slow_input", type=float, default=0.0)
parser.add_argument("--straggler_interval", type=float, default=0.0)
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
logging.getLogger("tfdist.training.stragglers").setLevel(logging.INFO)

strategy = tfdist.make_strategy(
    args.strategy, **({"num_devices": 2} if args.strategy == "mirrored" else {})
)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

if not args.straggler_interval:  # the straggler report times steps, which determinism forbids
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


STALL = threading.Event()  # set when DIE_TASK's input pipeline is to hang
stuck_here = task == args.die_task and attempt == 1 and args.stick_at >= 0


def stall_or_pass(x):
    if STALL.is_set():
        print(f"{task} input pipeline stuck", flush=True)
        threading.Event().wait()
    if args.slow_input and task == args.die_task:
        time.sleep(args.slow_input)
    return x


class StallingSource:
    """The examples of ``inner``, through a tf.py_function that can hang or slow down."""

    def __init__(self, inner):
        self.inner = inner

    def examples(self, input_context, *, training, seed):
        def through(x, y):
            passed = tf.py_function(stall_or_pass, [x], tf.float32)
            return tf.ensure_shape(passed, x.shape), y

        return self.inner.examples(input_context, training=training, seed=seed).map(through)


if stuck_here and args.stick_in == "save":
    from tfdist.training import backup as backup_lib

    original_save = backup_lib.Backup.save

    def hanging_save(self, position):
        if position.updates >= args.stick_at:
            print(f"{task} stuck in the backup save at update {position.updates}", flush=True)
            threading.Event().wait()
        return original_save(self, position)

    backup_lib.Backup.save = hanging_save


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
        if stuck_here and Die.seen - 1 == args.stick_at:
            if args.stick_in == "callback":
                print(f"{task} stuck in a callback after batch {Die.seen - 1}", flush=True)
                threading.Event().wait()
            elif args.stick_in == "input":
                STALL.set()
            elif args.stick_in == "frozen":
                print(f"{task} freezes (SIGSTOP) after batch {Die.seen - 1}", flush=True)
                os.kill(os.getpid(), signal.SIGSTOP)


watchdog_options = {}
if args.watchdog:
    floor, factor = (float(v) for v in args.watchdog.split(","))
    watchdog_options["watchdog"] = tfdist.WatchdogOptions(floor=floor, factor=factor, first=60)
if args.straggler_interval:
    watchdog_options["stragglers"] = tfdist.StragglerOptions(
        interval=args.straggler_interval, log_scores=True
    )
trainer = tfdist.Trainer(
    build,
    strategy=strategy,
    optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    backup_dir=args.backup_dir,
    backup_freq=2,
    **watchdog_options,
)
train = tfdist.data.load("synthetic", num_examples=512)
if args.stick_in == "input" or args.slow_input:
    train = dataclasses.replace(train, source=StallingSource(train.source))
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
