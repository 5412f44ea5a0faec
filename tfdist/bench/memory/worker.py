"""What each worker of ``tfdist bench --benchmarks=memory`` runs (its parent: ``parent.py``).

One launch trains one mode (``spec["sharding"]``: None, ``"optimizer"``, ``"gradients"`` or
``"parameters"``) of one workload (``spec["workload"]``: the MLP, or the GPT of
``spec["gpt"]`` on synthetic tokens), so that nothing of another mode's model, state or graphs
is left in the process whose memory is read. Every worker builds the same model from the same
seed, makes the Trainer with Adam and the mode's ``sharding=``, and:

1. reads the TF allocator (``tf.config.experimental.get_memory_info("CPU:0")``) and the
   process's RSS before the Trainer exists (``before``);
2. fits ``warmup_steps`` steps (the model and optimizer built, the function traced and run)
   and reads them again (``after_warmup``; its peak is the process's until then, the build
   included), then resets the allocator's peak;
3. times ``repeats`` fits of ``steps`` steps each (the steps' window only, as ``scaling``
   times a Trainer), and reads them a last time (``after_steps``: the peak over the timed
   steps alone);
4. reports the bytes each replica holds by kind (``Trainer.replica_bytes``: parameters,
   optimizer state, gradient buffers, master shards, from the variables' shapes), the
   optimizer's own variables on this replica (their shapes: blocks when sharded), a digest
   of the final weights and, where ``spec["weights_path"]`` is set, worker 0 saves them
   there (``.npz``) for the bench to compare modes element by element.

The allocator's figures count TensorFlow's tensors on the CPU (variables, gradients,
temporaries of the step) of 256 KiB and more: TF's oneDNN CPU allocator serves smaller ones
apart and counts none of them (a model of small tensors reads 0; without oneDNN,
``TF_ENABLE_ONEDNN_OPTS=0``, TF keeps no counts and the figures are None). RSS counts the
whole process (Python, TF's code, oneDNN's buffers, the small tensors). ``peak`` is the
largest ``current`` since the last reset.
"""

from __future__ import annotations

import os
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import tfdist
from tfdist.bench.first_fit.worker import weights_digest
from tfdist.bench.harness import fits
from tfdist.bench.harness.worker_common import Recorder, is_lead_task
from tfdist.bench.scaling.sides import NUM_BATCHES, build_model, make_dataset

MIB = float(1 << 20)


def status_kib(field: str) -> int | None:
    """A ``/proc/self/status`` field in KiB (``VmRSS``, ``VmHWM``); None where unreadable."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:  # not Linux
        pass
    return None


def memory_now() -> dict[str, int | None]:
    """The TF CPU allocator's current and peak bytes, and the process's RSS and peak RSS."""
    try:
        info: dict[str, int | None] = tf.config.experimental.get_memory_info("CPU:0")
    except ValueError:  # "Allocator stats not available": TF without oneDNN's allocator
        info = {"current": None, "peak": None}
    rss, hwm = status_kib("VmRSS"), status_kib("VmHWM")
    return {
        "allocator_current": info["current"],
        "allocator_peak": info["peak"],
        "rss": None if rss is None else rss * 1024,
        "rss_peak": None if hwm is None else hwm * 1024,
    }


def optimizer_bytes(optimizer: keras.optimizers.Optimizer) -> dict[str, int]:
    """Bytes of the optimizer's variables on this replica, from their shapes: the slots
    (Adam's moments; blocks when sharded) and the scalars (iterations, learning rate)."""
    slots = scalars = 0
    for v in optimizer.variables:
        size = int(np.prod(v.shape, dtype=np.int64)) * tf.as_dtype(v.dtype).size
        if len(v.shape):
            slots += size
        else:
            scalars += size
    return {"slots": slots, "scalars": scalars}


def build(spec: dict[str, Any]) -> keras.Model:
    """The workload's model: the MLP, or (``spec["workload"] == "gpt"``) the GPT of
    ``spec["gpt"]`` (``width``, ``depth``, ``heads``, ``vocabulary_size``, ``seq_len``)."""
    if spec.get("workload", "mlp") != "gpt":
        return build_model(spec)
    gpt = spec["gpt"]
    return tfdist.models.get(
        "gpt",
        input_shape=(int(gpt["seq_len"]),),
        num_classes=int(gpt["vocabulary_size"]),
        width=int(gpt["width"]),
        depth=int(gpt["depth"]),
        heads=int(gpt["heads"]),
    )


def dataset(spec: dict[str, Any], global_batch_size: int) -> tf.data.Dataset:
    """The workload's synthetic global batches, the same on every worker (the strategy splits
    them): the MLP's (``tfdist.bench.scaling.sides``), or random token windows whose targets
    are the next tokens."""
    if spec.get("workload", "mlp") != "gpt":
        return make_dataset(spec, global_batch_size)
    gpt = spec["gpt"]
    rng = np.random.default_rng(0)
    shape = (global_batch_size * NUM_BATCHES, int(gpt["seq_len"]) + 1)
    tokens = rng.integers(0, int(gpt["vocabulary_size"]), size=shape).astype("int32")
    ds = tf.data.Dataset.from_tensor_slices((tokens[:, :-1], tokens[:, 1:]))
    ds = ds.batch(global_batch_size, drop_remainder=True)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return ds.cache().repeat().with_options(options).prefetch(tf.data.AUTOTUNE)


def make_trainer(spec: dict[str, Any], strategy: tf.distribute.Strategy) -> Any:
    """The Trainer of one mode: the workload's model (seeded: the same weights in every mode),
    Adam."""
    keras.utils.set_random_seed(int(spec["seed"]))
    return tfdist.Trainer(
        lambda: build(spec),
        strategy=strategy,
        optimizer=keras.optimizers.Adam(float(spec["learning_rate"])),
        loss=fits.logits_loss(),
        sharding=spec.get("sharding"),
    )


def measure(spec: dict[str, Any], strategy: tf.distribute.Strategy) -> dict[str, Any]:
    """Trains ``spec["sharding"]``'s mode on ``strategy`` and returns this worker's figures.

    Args:
        spec: ``sharding``, ``input_dim``, ``hidden_units``, ``num_classes``,
            ``per_worker_batch_size`` (per replica), ``warmup_steps``, ``steps``, ``repeats``,
            ``learning_rate``, ``seed``; optional ``weights_path``, and ``workload``
            (``"mlp"``, the default, or ``"gpt"`` with ``gpt``: its sizes, `build`).
        strategy: multi_worker in the bench's tasks (mirrored in the tests).
    """
    replicas = strategy.num_replicas_in_sync
    global_batch_size = int(spec["per_worker_batch_size"]) * replicas
    steps, repeats = int(spec["steps"]), int(spec["repeats"])
    batches = dataset(spec, global_batch_size)
    memory = {"before": memory_now()}
    trainer = make_trainer(spec, strategy)

    def fit(**kw: Any) -> Any:
        return trainer.fit(batches, global_batch_size=global_batch_size, shuffle=False, **kw)

    fit(epochs=1, steps_per_epoch=int(spec["warmup_steps"]), verbose=0)
    memory["after_warmup"] = memory_now()
    if memory["after_warmup"]["allocator_peak"] is not None:
        tf.config.experimental.reset_memory_stats("CPU:0")
    iterations = lambda: int(trainer.model.optimizer.iterations.numpy())  # noqa: E731
    throughput = fits.FitThroughput(
        fit,
        steps=steps,
        global_batch_size=global_batch_size,
        iterations=iterations,
        from_epoch_begin=True,  # no batch hook: "auto" steps per call stays what users get
    )
    recorder = Recorder()
    seconds = [
        recorder.measure("steps", lambda: throughput()[1].seconds)[0] for _ in range(repeats)
    ]
    memory["after_steps"] = memory_now()
    weights = trainer.model.get_weights()
    if spec.get("weights_path") and is_lead_task():
        np.savez(spec["weights_path"], *weights)
    return {
        "workload": spec.get("workload", "mlp"),
        "sharding": spec.get("sharding"),
        "num_replicas": replicas,
        "global_batch_size": global_batch_size,
        "steps": steps,
        "seconds": seconds,
        "updates": throughput.updates,
        "parameters": int(sum(w.size for w in weights)),
        "replica_bytes": trainer.replica_bytes,
        "optimizer_variables": optimizer_bytes(trainer.model.optimizer),
        "memory": memory,
        "weights_digest": weights_digest(weights),
        "records": recorder.records,
        "pid": os.getpid(),
    }


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """The task's entry (``tfdist.bench.harness.workers``): `measure` on multi_worker."""
    return measure(spec, tfdist.make_strategy("multi_worker"))
