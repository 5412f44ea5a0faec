"""A worker program for multi-worker tests: trains a tiny model, saves weights.

Run under ``tfdist launch --workers=2 -- python tests/jobs/mwms_job.py MODES OUT_DIR``
with MODES a comma-separated list of trainer, trainer_accum, trainer_bucketed, trainer_zero1,
trainer_zero2_accum, trainer_zero3_accum, trainer_pipeline, trainer_pipeline_zero2_accum,
trainer_balanced, trainer_balanced_zero2_accum, trainer_balanced_bf16, balanced_resume,
adam_sharded, hybrid_transformer_adam, local_sgd, keras_fit, run
one after another. Each task writes OUT_DIR/<mode>-<task>.npz and .json.

The strategy leaves each worker a second logical CPU device (``stage_devices=2``): one replica
per worker on CPU:0, as without it, and a device for trainer_pipeline's second stage (the hybrid:
data parallel over the two workers x two pipeline stages in each). The modes in
``common.NESTED_MODES`` (trainer_zero3_accum) train a functional model nested in another, on
token ids (``common.nested_builder``, ``common.token_dataset``); trainer_zero3_accum keeps its
variables of fewer than 9 elements whole and mirrored (``KEEP_WHOLE_BELOW``), the rest cut.
"""

import json
import os
import sys

import tfdist

strategy = tfdist.make_strategy("multi_worker", stage_devices=2)

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jobs.common import (  # noqa: E402
    GLOBAL_BATCH,
    NESTED_MODES,
    builder,
    collectives_in_loop_body,
    dataset,
    initial_weights,
    nested_builder,
    nested_initial_weights,
    token_dataset,
)

modes, out_dir = sys.argv[1].split(","), sys.argv[2]
task = json.loads(os.environ["TF_CONFIG"])["task"]


SHARDING = {"trainer_zero1": "optimizer", "trainer_zero2_accum": "gradients"}
SHARDING["trainer_pipeline_zero2_accum"] = "gradients"
SHARDING["trainer_balanced_zero2_accum"] = "gradients"
SHARDING["trainer_zero3_accum"] = "parameters"
# ZeRO-3's small variables kept whole and mirrored (``keep_whole_below``): the two biases (8 and
# 3 elements); the embedding (40) and the kernels (32, 24) cut. In the mode that cuts, not in a
# mode of its own: each mode's traces cost its launch ~15 CPU-s.
KEEP_WHOLE_BELOW = {"trainer_zero3_accum": 9}
# Splits of each global batch of 16 (8 per micro-batch with accumulation), changed mid-epoch
# (6 updates an epoch): worker:0 takes 4, then 12, then 1, then the even 8.
BALANCE = {
    "trainer_balanced": ((0, (4, 12)), (2, (12, 4)), (5, (1, 15)), (9, (8, 8))),
    "trainer_balanced_zero2_accum": ((0, (2, 6)), (3, (7, 1)), (8, (4, 4))),
    "trainer_balanced_bf16": ((0, (3, 13)), (4, (13, 3))),
}


def adam_sharded():
    """Adam unsharded, then sharded (ZeRO-2): prints the largest weight difference."""
    weights = {}
    for sharding in (None, "gradients"):
        trainer = tfdist.Trainer(
            builder(initial_weights()),
            strategy=strategy,
            optimizer=keras.optimizers.Adam(0.01),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            sharding=sharding,
        )
        trainer.fit(dataset(), epochs=1, verbose=0)
        weights[sharding] = trainer.model.get_weights()
        if sharding:
            print("adam_sharded replica_bytes", json.dumps(trainer.replica_bytes))
    gap = max(float(np.max(np.abs(a - b))) for a, b in zip(*weights.values()))
    print("adam_sharded max_gap", gap)
    return trainer.model, {}


def hybrid_transformer_adam():
    """The hybrid on a causal transformer LM with Adam: 2 workers x 2 stages, cut after its
    attention (the residual stream crosses the cut beside the attention's output), the
    embedding's rows gathered from both workers."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from tests.keras_parity.rows_transformers import lm_model, text

    model = lm_model()
    attention = next(x for x in model.layers if isinstance(x, keras.layers.MultiHeadAttention))
    trainer = tfdist.Trainer(
        model,
        strategy=strategy,
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        pipeline=tfdist.PipelineOptions([attention.name], micro_batches=2),
    )
    ids = text()
    history = trainer.fit(
        ids[:, :-1], ids[:, 1:], batch_size=16, epochs=2, shuffle=False, verbose=0
    )
    return trainer.model, history.history


def balanced_resume(w0):
    """Forced splits, a crash after update 7 with a backup every 2 updates, then a new Trainer
    that resumes from update 6: the splits follow the backup's position."""
    backup_dir = os.path.join(out_dir, "balanced_resume_backup")  # both workers: one disk
    splits = ((0, (5, 11)), (5, (11, 5)), (9, (2, 14)))

    class Crash(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if self.model.optimizer.iterations.numpy() == 7:
                raise RuntimeError("simulated crash")

    for crash in (True, False):
        trainer = tfdist.Trainer(
            builder(w0),
            strategy=strategy,
            optimizer=keras.optimizers.SGD(0.1),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            balance=tfdist.BalanceOptions(splits=splits),
            steps_per_execution=1,
            backup_dir=backup_dir,
            backup_freq=2,
        )
        try:
            history = trainer.fit(
                dataset(), epochs=2, verbose=0, callbacks=[Crash()] if crash else None
            )
        except RuntimeError:
            print("balanced_resume crashed at", int(trainer.model.optimizer.iterations.numpy()))
    return trainer.model, history.history


def sync_collectives(tf_function):
    """All-reduce ops in the branches the loop body takes when a sync is due (a tf.cond's)."""
    from tfdist._compat.keras_internals.keras_training import concrete_functions

    count = 0
    for concrete in concrete_functions(tf_function):
        for f in concrete.graph.as_graph_def().library.function:
            if "cond" in f.signature.name and "_true_" in f.signature.name:
                count += sum(n.op == "CollectiveReduceV2" for n in f.node_def)
    return count


def local_sgd(w0):
    """Local SGD on the two workers: sync_every=1 (its weights saved as local_sgd_h1), then
    DiLoCo (Adam inside, Nesterov outside) with sync_every=5 over 12 updates, one call per
    update: each update's weights' digest, the digest after fit (whose end syncs the partial
    round of updates 11-12), the syncs, the loop's collectives."""
    import hashlib

    def digest(model):
        return hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights())).hexdigest()[:16]

    class Digest(keras.callbacks.Callback):
        def __init__(self, label="local_sgd digest"):
            super().__init__()
            self.label = label

        def on_train_batch_end(self, batch, logs=None):
            update = int(self.model.optimizer.iterations.numpy())
            print(self.label, update, digest(self.model))

    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    for h1 in (True, False):
        outer = None if h1 else keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True)
        trainer = tfdist.Trainer(
            builder(w0),
            strategy=strategy,
            optimizer=keras.optimizers.SGD(0.1) if h1 else keras.optimizers.Adam(0.01),
            loss=loss,
            local_sgd=tfdist.LocalSGDOptions(sync_every=1 if h1 else 5, outer_optimizer=outer),
            steps_per_execution="auto" if h1 else 1,
        )
        history = trainer.fit(
            dataset(), epochs=2, verbose=0, callbacks=None if h1 else [Digest()]
        ).history
        if h1:
            name = f"local_sgd_h1-{task['type']}-{task['index']}"
            np.savez(os.path.join(out_dir, name + ".npz"), *trainer.model.get_weights())
    print("local_sgd final digest", digest(trainer.model))
    print("local_sgd syncs", json.dumps(history["syncs"]))
    counts = collectives_in_loop_body(trainer.train_functions[(GLOBAL_BATCH, 1)])
    print("local_sgd gradient_all_reduces_per_update", counts["float"])
    print("local_sgd all_reduces_per_sync", sync_collectives(trainer.train_functions[(16, 1)]))
    local_sgd_stragglers(Digest("local_sgd adapt digest"))
    return trainer.model, history


def local_sgd_stragglers(digest):
    """adapt_to_stragglers, sync_every=4, 12 updates, Adam, on the causal transformer LM
    (tests/keras_parity/rows_transformers.py: an Embedding's sparse rows, causal attention,
    LayerNormalization, Dense over 3-D input; its padding ignored, a masked loss): worker:1
    sleeps 100 ms in every forward pass, so in the third round (the first round's times are
    dropped) it takes fewer inner steps than worker:0's 4; each update's digest, each worker's
    local_steps, the next round's agreed steps."""
    import time

    import tensorflow as tf

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from tests.keras_parity.rows_transformers import SEQ, lm_model, text

    class Delay(keras.layers.Layer):
        def __init__(self, seconds, **kwargs):
            super().__init__(**kwargs)
            self.seconds = seconds

        def call(self, x):
            if not self.seconds:
                return x
            done = tf.py_function(lambda: time.sleep(self.seconds) or 0.0, [], tf.float32)
            with tf.control_dependencies([done]):
                return tf.identity(x)

    def slowed():
        ids = keras.Input((SEQ,), dtype="int32")
        return keras.Model(ids, lm_model()(Delay(0.1 if task["index"] == 1 else 0.0)(ids)))

    trainer = tfdist.Trainer(
        slowed,
        strategy=strategy,
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0),
        local_sgd=tfdist.LocalSGDOptions(sync_every=4, adapt_to_stragglers=True),
        steps_per_execution=1,
        stragglers=None,  # adapting times the updates itself (the Trainer refuses both)
    )
    ids = text(96)  # 6 updates of 16 an epoch
    history = trainer.fit(
        ids[:, :-1], ids[:, 1:], batch_size=16, epochs=2, shuffle=False, verbose=0,
        callbacks=[digest],
    ).history  # fmt: skip
    print("local_sgd adapt local_steps", json.dumps(history["local_steps"]))
    steps = trainer._functions.updates.local.steps.numpy().tolist()  # the agreed schedule
    print("local_sgd adapt steps", json.dumps(steps))


def train(mode):
    w0 = initial_weights()
    if mode == "adam_sharded":
        model, history = adam_sharded()
    elif mode == "hybrid_transformer_adam":
        model, history = hybrid_transformer_adam()
    elif mode == "balanced_resume":
        model, history = balanced_resume(w0)
    elif mode == "local_sgd":
        model, history = local_sgd(w0)
    elif mode.startswith("trainer"):
        k = 2 if mode.endswith("_accum") else 1
        # trainer_pipeline: the model made here (its layer names known), cut after its first
        # layer, each worker's 8 examples in 2 micro-batches.
        piped = mode.startswith("trainer_pipeline")
        model = builder(w0)() if piped else builder(w0)
        # NESTED_MODES: a functional model inside a functional one, on token ids (common.py).
        nested = mode in NESTED_MODES
        model = nested_builder(nested_initial_weights()) if nested else model
        pipeline = None
        if piped:
            pipeline = tfdist.PipelineOptions([model.layers[0].name], micro_batches=2)
        # trainer_bucketed: the 4 gradients (12, 96, 32, 192 bytes in reverse order) make 2
        # buckets of >= 100 bytes.
        trainer = tfdist.Trainer(
            model,
            strategy=strategy,
            optimizer=keras.optimizers.SGD(0.1),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            accumulation_steps=k,
            bucket_bytes=100 if mode == "trainer_bucketed" else None,
            gradient_compression="bf16" if mode.endswith("_bf16") else None,
            sharding=SHARDING.get(mode),
            keep_whole_below=KEEP_WHOLE_BELOW.get(mode),
            pipeline=pipeline,
            balance=tfdist.BalanceOptions(splits=BALANCE[mode]) if mode in BALANCE else False,
            steps_per_execution=1 if mode in BALANCE else "auto",
        )
        # k micro-batches of GLOBAL_BATCH // k make one update of GLOBAL_BATCH.
        data = (token_dataset if nested else dataset)(global_batch=GLOBAL_BATCH // k)
        history = trainer.fit(data, epochs=2, verbose=0).history
        model = trainer.model
        print(mode, "iterations", int(model.optimizer.iterations.numpy()))
        counts = collectives_in_loop_body(trainer.train_functions[(GLOBAL_BATCH // k, k)])
        print(mode, "gradient_all_reduces_per_update", counts["float"])
        if mode in KEEP_WHOLE_BELOW:  # which variables stayed whole, which were cut
            state = trainer._functions.sharded
            kept, cut = sorted(state.kept), state.cut_indices
            print(mode, "kept", json.dumps(kept), "cut", json.dumps(cut))
        if pipeline is not None:
            stages = [[v.value.device for v in s.model.variables] for s in trainer.stages]
            print(mode, "stage_devices", json.dumps(stages))
            if SHARDING.get(mode):  # each master shard next to its variable
                masters = trainer._functions.sharded.masters
                print(mode, "master_devices", json.dumps([m.value.device for m in masters]))
            print(mode, "evaluate", json.dumps(trainer.evaluate(dataset(), verbose=0)))
    else:
        with strategy.scope():
            model = builder(w0)()
            model.compile(
                keras.optimizers.SGD(0.1),
                keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"],
            )
        history = model.fit(dataset(), epochs=2, verbose=0).history
    name = f"{mode}-{task['type']}-{task['index']}"
    np.savez(os.path.join(out_dir, name + ".npz"), *model.get_weights())
    with open(os.path.join(out_dir, name + ".json"), "w") as f:
        json.dump({k: [float(v) for v in vs] for k, vs in history.items()}, f)
    print(mode, "done", strategy.num_replicas_in_sync)


for mode in modes:  # one after another on the one cluster: its start-up is most of the cost
    train(mode)
