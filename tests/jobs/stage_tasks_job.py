"""A worker program for pipeline stages on two tasks: the chief trains, worker 1 serves stage 2.

Run under ``tfdist launch --workers=2 -- python tests/jobs/stage_tasks_job.py OUT_DIR``. The
chief trains the tiny model with Adam as 2 stages (one per task) and 2 micro-batches, then the
same on its own device without a pipeline, and prints the devices and the largest gap. A third
pipeline Trainer on the kept backup restores it (each stage's variables and slots from its task)
and has nothing left to train.
"""

import json
import os
import sys

import tfdist

devices = tfdist.stage_tasks()  # worker 1 serves here and never returns

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jobs.common import builder, dataset, initial_weights  # noqa: E402

out_dir = sys.argv[1]
w0 = initial_weights()


def fit(pipeline, epochs=2):
    model = builder(w0)()
    options = None
    if pipeline:
        options = tfdist.PipelineOptions([model.layers[0].name], micro_batches=2, devices=devices)
    trainer = tfdist.Trainer(
        model,
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        pipeline=options,
        backup_dir=os.path.join(out_dir, "backup") if pipeline else None,
        keep_backup=True if pipeline else None,
    )
    history = trainer.fit(dataset(), epochs=epochs, verbose=0).history
    return trainer, history


piped, history = fit(True)
print("devices", json.dumps(devices))
print(
    "stage_devices", json.dumps([[v.value.device for v in s.model.variables] for s in piped.stages])
)
slots = {v.path: v.value.device for v in piped.model.optimizer.variables if "moment" in v.path}
print("slot_devices", json.dumps(slots))
local, local_history = fit(False)
gap = max(
    float(np.max(np.abs(a - b)))
    for a, b in zip(piped.model.get_weights(), local.model.get_weights())
)
print("max_gap", gap)
print("histories", json.dumps([history, local_history]))
resumed, resumed_history = fit(True)
same = all(
    np.array_equal(a, b) for a, b in zip(resumed.model.get_weights(), piped.model.get_weights())
)
print("resumed", same, int(resumed.model.optimizer.iterations.numpy()), json.dumps(resumed_history))
