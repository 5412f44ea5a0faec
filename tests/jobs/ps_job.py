"""A program for multi-process parameter-server tests; every task runs it.

    tfdist launch --chief --workers=2 --ps=1 [--max_restarts=1] -- \\
        python tests/jobs/ps_job.py OUT_DIR [BATCH:TASK[,BATCH:TASK...] [wait_rejoin]]

Workers and ps serve inside make_strategy; the chief trains digits, SIGKILLs
each TASK (e.g. worker-1 or ps-0) once batch BATCH (counted across
epochs) has ended, and writes
OUT_DIR/result.json. Before a later kill it waits until every task killed
earlier has been restarted by the launcher. With wait_rejoin it also pauses
after the last kill until the killed tasks are restarted, so they rejoin
while training is still going on.
"""

import json
import os
import pathlib
import signal
import sys
import time

out = pathlib.Path(sys.argv[1])
kills = (
    [(int(b), t) for b, t in (k.split(":") for k in sys.argv[2].split(","))]
    if len(sys.argv) > 2
    else []
)
wait_rejoin = len(sys.argv) > 3 and sys.argv[3] == "wait_rejoin"
task = json.loads(os.environ["TF_CONFIG"])["task"]
name = f"{task['type']}-{task['index']}"
starts = out / f"{name}.starts"
starts.write_text(
    starts.read_text() + f"{os.getpid()}\n" if starts.exists() else f"{os.getpid()}\n"
)

import tfdist  # noqa: E402

strategy = tfdist.make_strategy("parameter_server")  # workers and ps serve here until stopped

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.get_logger().setLevel("INFO")  # shows the coordinator's "Worker ... has been recovered."


def _starts(name):
    return (out / f"{name}.starts").read_text().split()


def _serving(name):
    """Whether task ``name`` (e.g. worker-1) accepts connections on its TF_CONFIG address."""
    import socket

    kind, index = name.rsplit("-", 1)
    host, port = json.loads(os.environ["TF_CONFIG"])["cluster"][kind][int(index)].rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
        return True
    except OSError:
        return False


class Killer(keras.callbacks.Callback):
    killed: list = []
    batches = 0  # across epochs

    def on_train_batch_end(self, batch, logs=None):
        batch = self.batches
        self.batches += 1
        while kills and kills[0][0] <= batch:
            _, victim = kills.pop(0)
            for earlier in self.killed:  # wait for the launcher to restart earlier victims
                deadline = time.time() + 60
                while len(_starts(earlier)) < 2 and time.time() < deadline:
                    time.sleep(0.2)
                time.sleep(3)  # and for the coordinator to see them back
            pid = int(_starts(victim)[-1])
            print(f"killing {victim} (pid {pid}) after batch {batch}", flush=True)
            os.kill(pid, signal.SIGKILL)
            self.killed.append(victim)
            if wait_rejoin and not kills:
                deadline = time.time() + 60
                while len(_starts(victim)) < 2 and time.time() < deadline:
                    time.sleep(0.2)
                # Its server is up once its port takes connections (TF's import and start-up
                # can take many seconds on a loaded machine); the coordinator polls for
                # recovered workers every 5 s.
                while not _serving(victim) and time.time() < deadline:
                    time.sleep(0.2)
                time.sleep(8)


keras.utils.set_random_seed(0)
trainer = tfdist.Trainer(
    lambda: tfdist.models.get("cnn"),
    strategy=strategy,
    optimizer=keras.optimizers.Adam(2e-3),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
)
history = trainer.fit(
    tfdist.data.load("digits"),
    epochs=4,
    steps_per_epoch=30,
    global_batch_size=64,
    validation_data=tfdist.data.load("digits", split="validation"),
    callbacks=[Killer()],
    verbose=2,
)
result = {
    "iterations": int(trainer.model.optimizer.iterations.numpy()),
    "val_accuracy": history.history["val_accuracy"][-1],
}
(out / "result.json").write_text(json.dumps(result))
print("result", json.dumps(result), flush=True)
