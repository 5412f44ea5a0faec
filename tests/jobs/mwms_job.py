"""A worker program for multi-worker tests: trains a tiny model, saves weights.

Run under ``tfdist launch --workers=2 -- python tests/jobs/mwms_job.py MODES OUT_DIR``
with MODES a comma-separated list of trainer, trainer_accum, trainer_bucketed, keras_fit,
run one after another. Each task writes OUT_DIR/<mode>-<task>.npz and .json.
"""

import json
import os
import sys

import tfdist

strategy = tfdist.make_strategy("multi_worker")

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jobs.common import GLOBAL_BATCH, builder, collectives_in_loop_body, dataset, initial_weights  # noqa: E402

modes, out_dir = sys.argv[1].split(","), sys.argv[2]
task = json.loads(os.environ["TF_CONFIG"])["task"]


def train(mode):
    w0 = initial_weights()
    if mode in ("trainer", "trainer_accum", "trainer_bucketed"):
        k = 2 if mode == "trainer_accum" else 1
        # trainer_bucketed: the 4 gradients (12, 96, 32, 192 bytes in reverse order) make 2
        # buckets of >= 100 bytes.
        trainer = tfdist.Trainer(
            builder(w0),
            strategy=strategy,
            optimizer=keras.optimizers.SGD(0.1),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            accumulation_steps=k,
            bucket_bytes=100 if mode == "trainer_bucketed" else None,
        )
        # k micro-batches of GLOBAL_BATCH // k make one update of GLOBAL_BATCH.
        history = trainer.fit(dataset(global_batch=GLOBAL_BATCH // k), epochs=2, verbose=0)
        model = trainer.model
        print(mode, "iterations", int(model.optimizer.iterations.numpy()))
        counts = collectives_in_loop_body(trainer.train_functions[(GLOBAL_BATCH // k, k)])
        print(mode, "gradient_all_reduces_per_update", counts["float"])
    else:
        with strategy.scope():
            model = builder(w0)()
            model.compile(
                keras.optimizers.SGD(0.1),
                keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"],
            )
        history = model.fit(dataset(), epochs=2, verbose=0)
    name = f"{mode}-{task['type']}-{task['index']}"
    np.savez(os.path.join(out_dir, name + ".npz"), *model.get_weights())
    with open(os.path.join(out_dir, name + ".json"), "w") as f:
        json.dump({k: [float(v) for v in vs] for k, vs in history.history.items()}, f)
    print(mode, "done", strategy.num_replicas_in_sync)


for mode in modes:  # one after another on the one cluster: its start-up is most of the cost
    train(mode)
