"""A two-worker program for SIGTERM, chief-only callback outputs and a non-shared backup_dir.

    tfdist launch --workers=2 -- python tests/jobs/workers_job.py MODE OUT_DIR

MODE:
  sigterm     no backup_dir; a TensorBoard callback writes to OUT_DIR/logs;
              worker-1 sends itself SIGTERM after its 10th batch (the 4th of
              the 2nd epoch). Every worker should stop at the same step and
              exit 143.
  not_shared  backup_dir is OUT_DIR/<task>-backup, a different directory per
              worker (like a local disk per machine): every worker should
              fail at the start with the same clear error.

Each task writes OUT_DIR/<task>.pid. In sigterm mode it also writes OUT_DIR/<task>.claim
(what its claim of a shared health-board key returned: null if it won) and appends each
batch its callbacks saw to OUT_DIR/<task>.batches ("epoch:batch" per line).
"""

import json
import os
import pathlib
import signal
import sys
import time

mode, out = sys.argv[1], pathlib.Path(sys.argv[2])
task = json.loads(os.environ["TF_CONFIG"])["task"]
name = f"{task['type']}-{task['index']}"
(out / f"{name}.pid").write_text(str(os.getpid()))

import tfdist  # noqa: E402

strategy = tfdist.make_strategy("multi_worker")
if mode == "sigterm":
    # Both tasks race to claim one key of the health board (the watchdog's alarm, in a fit):
    # exactly one may win, and the other must read the winner's value.
    from tfdist.training.health.board import Board

    claimed = Board(["worker:0", "worker:1"], shared=True).claim("race", {"by": name})
    (out / f"{name}.claim").write_text(json.dumps(claimed))

import keras  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jobs.common import builder, dataset, initial_weights  # noqa: E402


class Record(keras.callbacks.Callback):
    epoch = 0
    seen = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        with open(out / f"{name}.batches", "a") as f:
            f.write(f"{self.epoch}:{batch}\n")
        if name == "worker-1" and self.seen == 9:
            print(f"{name} receives SIGTERM after batch {self.seen}", flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
        self.seen += 1


backup_dir = str(out / f"{name}-backup") if mode == "not_shared" else None
trainer = tfdist.Trainer(
    builder(initial_weights()),
    strategy=strategy,
    optimizer=keras.optimizers.SGD(0.1),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    backup_dir=backup_dir,
)
callbacks = [Record(), keras.callbacks.TensorBoard(log_dir=str(out / "logs"), update_freq=1)]
try:
    trainer.fit(dataset(), epochs=3, callbacks=callbacks, verbose=0)  # 6 batches per epoch
except ValueError as e:
    print(f"{name} error: {e}", flush=True)
    if name != "worker-0":
        time.sleep(2)  # let worker-0 print its own error before the launcher stops it
    sys.exit(1)
print(f"{name} finished", flush=True)
