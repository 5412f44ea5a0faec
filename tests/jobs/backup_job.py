"""A training program for backup/restore and preemption tests.

    [tfdist launch --workers=2 [--max_restarts=1] --] python tests/jobs/backup_job.py \\
        STRATEGY OUT_DIR BACKUP_DIR [--die_at=BATCH | --sigterm_at=BATCH] [--die_task=worker-1]
        [--faults=KIND:TASK:UPDATE,...] [--watchdog=FLOOR,FACTOR] [--no_backup | --sync_backup]
        [--slow_input=BASE,SLOW --slow_from=UPDATE --straggler_interval=SECONDS]
        [--local_sgd=H [--reference]]

Trains a small MLP (with a counter of replica steps) on synthetic data with
Trainer(backup=BackupOptions(BACKUP_DIR, freq=2)) under op determinism
(asynchronous backups; --sync_backup: asynchronous=False). With --die_at,
DIE_TASK's first attempt calls os._exit(3) after global batch BATCH; with
--sigterm_at it sends itself SIGTERM there (a preemption notice). With
--faults, attempt i of TASK hangs after optimizer update UPDATE of the i-th
fault, alive: KIND ``callback`` blocks in a callback, ``input`` in a
tf.py_function of its input pipeline, ``save`` inside a backup save, and
``frozen`` stops itself with SIGSTOP. --slow_input=BASE,SLOW sleeps BASE seconds per
example in every task's input pipeline, and from update --slow_from on, SLOW in
DIE_TASK's (a straggler, for the straggler report). --local_sgd=H trains with DiLoCo (the
inner SGD, an outer Nesterov SGD(0.7, 0.9), a sync every H updates); --reference then trains
a second, uninterrupted model without backups in the same processes. Each task writes
OUT_DIR/<task>.npz (weights), OUT_DIR/<task>.json and, with --reference,
OUT_DIR/<task>-reference.npz.
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
parser.add_argument("--faults", default="", help="KIND:TASK:UPDATE per attempt, comma separated")
parser.add_argument("--watchdog", default="", help="FLOOR,FACTOR: the watchdog's options")
parser.add_argument("--no_backup", action="store_true")
parser.add_argument("--sync_backup", action="store_true", help="BackupOptions(asynchronous=False)")
parser.add_argument("--slow_input", default="", help="BASE,SLOW: seconds per example")
parser.add_argument("--slow_from", type=int, default=0)
parser.add_argument("--sharding", default=None, help="optimizer or gradients (ZeRO-1/2)")
parser.add_argument("--straggler_interval", type=float, default=0.0)
parser.add_argument("--straggler_restart_after", type=int, default=None)
parser.add_argument("--slow_trace", type=float, default=0.0, help="seconds per trace of the model")
parser.add_argument(
    "--balance", action="store_true", help="fixed uneven splits of each global batch of 32"
)
parser.add_argument("--slow_saves", default="", help="SECONDS,N: the first N saves take that long")
parser.add_argument("--local_sgd", type=int, default=0, help="DiLoCo, a sync every N updates")
parser.add_argument("--reference", action="store_true", help="then an uninterrupted fit")
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
logging.getLogger("tfdist.training.backup.writer").setLevel(logging.INFO)
logging.getLogger("tfdist.training.health.stragglers").setLevel(logging.INFO)


class StragglerWarnings(logging.Handler):
    """Appends each straggler warning, with its time, to OUT_DIR/<task>.stragglers (JSON lines)."""

    def emit(self, record):
        if record.levelno >= logging.WARNING:
            line = json.dumps({"time": time.time(), "message": record.getMessage()})
            with open(out / f"{task}.stragglers", "a") as f:
                f.write(line + "\n")


logging.getLogger("tfdist.training.health.stragglers").addHandler(StragglerWarnings())

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
        time.sleep(args.slow_trace)  # Python in call runs when the step is traced, not per step
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


STALL = threading.Event()  # set when this task's input pipeline is to hang
SLOW = threading.Event()  # set when DIE_TASK's input pipeline is to slow down
faults = [f.split(":") for f in args.faults.split(",") if f]
fault = faults[attempt - 1] if attempt <= len(faults) else None
if fault is not None and fault[1] != task:
    fault = None
fault_kind, fault_at = (fault[0], int(fault[2])) if fault else (None, -1)


def stall_or_pass(x):
    if STALL.is_set():
        print(f"{task} input pipeline stuck", flush=True)
        threading.Event().wait()
    if args.slow_input:
        base, slow = (float(v) for v in args.slow_input.split(","))
        time.sleep(slow if SLOW.is_set() and task == args.die_task else base)
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


if args.slow_saves:
    from tfdist.training.backup import writer as backup_lib

    slow_seconds, slow_count = args.slow_saves.split(",")
    slow_left = [int(slow_count)]
    plain_save = backup_lib.Backup.save

    def slow_save(self, position):
        if slow_left[0] > 0:
            slow_left[0] -= 1
            time.sleep(float(slow_seconds))
        return plain_save(self, position)

    backup_lib.Backup.save = slow_save

if fault_kind == "save":
    from tfdist.training.backup import writer as backup_lib

    original_save = backup_lib.Backup.save

    def hanging_save(self, position):
        if position.updates >= fault_at:
            print(f"{task} stuck in the backup save at update {position.updates}", flush=True)
            threading.Event().wait()
        return original_save(self, position)

    backup_lib.Backup.save = hanging_save


def inject(updates):
    """Starts this attempt's fault after optimizer update ``updates``, or slows the input."""
    if args.slow_from and updates == args.slow_from:
        print(f"{task}: {args.die_task} slows down at update {updates}", flush=True)
        (out / f"{task}.slowed").write_text(str(time.time()))
        SLOW.set()
    if updates != fault_at:
        return
    print(f"{task} {fault_kind} fault after update {updates} at {time.time()}", flush=True)
    if fault_kind == "callback":
        threading.Event().wait()
    elif fault_kind == "input":
        STALL.set()
    elif fault_kind == "frozen":
        os.kill(os.getpid(), signal.SIGSTOP)


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
        inject(int(self.model.optimizer.iterations.numpy()))


watchdog_options = {}
if args.watchdog:
    floor, factor = (float(v) for v in args.watchdog.split(","))
    watchdog_options["watchdog"] = tfdist.WatchdogOptions(floor=floor, factor=factor, first=60)
if args.straggler_interval:
    watchdog_options["stragglers"] = tfdist.StragglerOptions(
        interval=args.straggler_interval,
        log_scores=True,
        restart_after=args.straggler_restart_after,
    )


def make_trainer(backup):
    local_sgd = None
    if args.local_sgd:
        outer = keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True)
        local_sgd = tfdist.LocalSGDOptions(args.local_sgd, outer_optimizer=outer)
    return tfdist.Trainer(
        build,
        strategy=strategy,
        optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        backup=None
        if not backup
        else tfdist.BackupOptions(args.backup_dir, freq=2, asynchronous=not args.sync_backup),
        sharding=args.sharding,
        # Worker 0's share changes at updates 0, 9 and 30 (one worker: nothing to balance).
        balance=tfdist.BalanceOptions(splits=((0, (10, 22)), (9, (22, 10)), (30, (6, 26))))
        if args.balance
        else False,
        local_sgd=local_sgd,
        **watchdog_options,
    )


trainer = make_trainer(backup=not args.no_backup)
train = tfdist.data.load("synthetic", num_examples=512)
if args.watchdog or args.slow_input:
    # Examples pass through a tf.py_function that a fault can hang (every run with --watchdog,
    # so that a reference run reads the same batches as a faulty one).
    train = dataclasses.replace(train, source=StallingSource(train.source))
if args.slow_input:  # a small shuffle buffer, so that the slow-down is not all read ahead
    train = dataclasses.replace(train, shuffle_buffer_size=32)
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
if args.reference:
    reference = make_trainer(backup=False)
    reference.fit(train, epochs=args.epochs, global_batch_size=32, verbose=0)
    np.savez(out / f"{task}-reference.npz", *reference.model.get_weights())
print("finished", task, "attempt", attempt, flush=True)
