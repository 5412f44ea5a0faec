"""A worker program: every multi_worker Keras parity row, one after another, on one cluster.

Run once for all rows (the cluster's start-up is most of the cost):

    python -m tfdist launch --workers=2 -- python tests/jobs/parity_job.py OUT_DIR [ROW,ROW...]

For each row with "multi_worker" in its strategies (or only the rows named), each task writes
OUT_DIR/<row>-<task>.npz and .json (:func:`tests.keras_parity.parity.save_result`), or
OUT_DIR/<row>-<task>.error with the traceback, and goes on to the next row: one bad row fails
its own test only. (A row that fails on one worker alone, inside a collective, leaves the other
waiting: the test's launch timeout then names the row in progress.)

It also writes OUT_DIR/_shards-<task>.json and _shards_files-<task>.json: the example ids each
worker's replica gets at each step when the Trainer distributes a dataset of global batches
(``tf.data`` autosharding), from memory and from 2 TFRecord files, so the test can check that
the two halves make Keras's global batches.
"""

import json
import os
import sys
import traceback

import tfdist

strategy = tfdist.make_strategy("multi_worker")  # first, before other TF work

import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.keras_parity.parity import run_trainer, save_result  # noqa: E402
from tests.keras_parity.rows import ROWS  # noqa: E402

SHARD_EXAMPLES, SHARD_BATCH = 21, 4  # 5 full global batches and one of 1: one worker gets none

out_dir = sys.argv[1]
only = set(sys.argv[2].split(",")) if len(sys.argv) > 2 else None
task = json.loads(os.environ["TF_CONFIG"])["task"]
task_name = f"{task['type']}-{task['index']}"


def id_datasets():
    """Example ids 0..20 as global batches of 4, from memory and from 2 TFRecord files."""
    files = []
    for part, ids in enumerate((range(0, 11), range(11, SHARD_EXAMPLES))):
        files.append(os.path.join(out_dir, f"_ids-{task_name}-{part}.tfrecord"))
        with tf.io.TFRecordWriter(files[-1]) as w:
            for i in ids:
                w.write(str(i).encode())
    records = tf.data.TFRecordDataset(files).map(lambda r: tf.strings.to_number(r, tf.int64))
    return {
        "_shards": tf.data.Dataset.range(SHARD_EXAMPLES).batch(SHARD_BATCH),
        "_shards_files": records.batch(SHARD_BATCH),
    }


def shards(name, ids):
    """The example ids this worker's replica reads per step, through the Trainer's own path."""
    from tfdist.data.inputs import Reading, as_input
    from tfdist.strategies.factory import runner_for

    runner = runner_for(strategy)
    source = as_input(
        ids, Reading(training=True), input_context=runner.input_context(), global_batch_size=None
    )
    steps = []
    for batch in runner.make_iterator(runner.distribute(source)):
        steps.append([int(i) for t in strategy.experimental_local_results(batch) for i in t])
    with open(os.path.join(out_dir, f"{name}-{task_name}.json"), "w") as f:
        json.dump({"examples": SHARD_EXAMPLES, "batch": SHARD_BATCH, "steps": steps}, f)


def recorded(name, fn):
    """Runs ``fn()``; an exception goes to OUT_DIR/<name>-<task>.error, for that test alone."""
    print("row", name, "start", flush=True)
    try:
        fn()
        print("row", name, "done", flush=True)
    except Exception:  # noqa: BLE001 - recorded for the row's own test
        with open(os.path.join(out_dir, f"{name}-{task_name}.error"), "w") as f:
            f.write(traceback.format_exc())
        print("row", name, "failed", flush=True)


def save_row(row):
    os.environ["TFDIST_PARITY_SHARED_DIR"] = os.path.join(out_dir, "shared", row.name)
    save_result(run_trainer(row, strategy), os.path.join(out_dir, f"{row.name}-{task_name}"))


for name, ids in id_datasets().items():
    recorded(name, lambda: shards(name, ids))  # noqa: B023 - called at once
for row in ROWS:
    if "multi_worker" in row.strategies and (only is None or row.name in only):
        recorded(row.name, lambda: save_row(row))  # noqa: B023 - called at once
print("parity job done", strategy.num_replicas_in_sync)
