"""What each task of ``tfdist bench --benchmarks=language_model`` runs (its parent: ``parent.py``).

Two launches, each with the spec's GPT (``tfdist.models.get("gpt", ...)``, the same seeded
initial weights everywhere), Adam, the same global batch of ``seq_len``-byte windows of
``tfdist.data.load("python_source", ...)``:

* ``spec["strategy"] == "local"``: one process with 2 logical CPU devices times its sides
  alternately (``tfdist.bench.scaling.sides.time_sides``): plain Keras ``model.fit`` on one
  device (no strategy, as a user runs it), the Trainer on ``one_device``, on ``mirrored`` x2,
  on ``mirrored`` x2 with ``sharding="gradients"``, and a 2-stage pipeline (the default
  strategy, cut between blocks, a stage on each logical device); then the Trainer on
  ``one_device`` trains from fresh weights to the target validation bits per byte.
* ``spec["strategy"] == "multi_worker"``: each of 2 worker processes times the Trainer on
  ``multi_worker`` and, beside it, one side per name in ``spec["local_sgd"]`` (local SGD or
  DiLoCo, ``tfdist.bench.harness.fits.local_sgd_option``: Adam inside), then trains the
  synchronous Trainer to the target, then each of ``spec["local_sgd_to_target"]`` from fresh
  weights (between syncs, each worker validates its own copy; the all-reduced mean is read).

Every timed side trains ``steps`` updates per measurement on 8 cached global batches of real
text; the run to the target reads the training split and evaluates on the validation split
every ``eval_every`` updates (``tfdist.bench.time_to_accuracy.worker.fit_to_target``).
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

import tfdist
from tfdist.bench.harness import fits
from tfdist.bench.harness.worker_common import Recorder
from tfdist.bench.scaling.sides import Side, fit_side, time_sides
from tfdist.bench.time_to_accuracy.worker import fit_to_target
from tfdist.models.language import BitsPerByte

#: Distinct global batches the timed sides cycle through (cached).
NUM_BATCHES = 8
#: The sides each launch times, in the order they alternate.
LOCAL_SIDES = ("keras_fit", "trainer", "mirrored", "sharded", "pipeline")
WORKER_SIDES = ("multi_worker",)
#: The pipeline's devices: the local process's 2 logical CPU devices.
STAGE_DEVICES = ["/device:CPU:0", "/device:CPU:1"]
#: The recorder's name of the run to the target.
TO_TARGET = "gpt/to_target"


def pipeline_cut(depth: int) -> str:
    """The block after which a 2-stage pipeline cuts the GPT: half the blocks on each stage."""
    return f"block_{max(depth // 2, 1) - 1}"


def global_batches(train: Any, global_batch_size: int) -> tf.data.Dataset:
    """`NUM_BATCHES` global batches of the shuffled training split, cached and repeated.

    Split by data, so that every worker of ``multi_worker`` reads its part of each batch.
    """
    x, y = next(iter(train.bind(global_batch_size=global_batch_size * NUM_BATCHES)()))
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch_size, drop_remainder=True)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return ds.cache().repeat().with_options(options).prefetch(tf.data.AUTOTUNE)


def _adam(spec: dict[str, Any]) -> keras.optimizers.Optimizer:
    return keras.optimizers.Adam(float(spec["learning_rate"]))


def _trainer(spec: dict[str, Any], builder: Any, strategy: Any, **options: Any) -> Any:
    return tfdist.Trainer(
        builder,
        strategy=strategy,
        optimizer=_adam(spec),
        loss=fits.logits_loss(),
        steps_per_execution=int(spec["steps_per_execution"]),
        **options,
    )


def trainer_side(spec: dict[str, Any], trainer: Any, dataset: tf.data.Dataset) -> Side:
    """A timed side of ``trainer.fit`` on the cached global batches."""
    gbs = int(spec["global_batch_size"])
    return fit_side(
        lambda **kw: trainer.fit(dataset, global_batch_size=gbs, shuffle=False, **kw),
        lambda: trainer.model.optimizer,
        int(spec["steps"]),
        gbs,
        from_epoch_begin=True,
    )


def keras_side(spec: dict[str, Any], builder: Any, dataset: tf.data.Dataset) -> Side:
    """Plain Keras: the model built, compiled and fit with no strategy, on one device."""
    model = fits.compiled_in_scope(
        tf.distribute.get_strategy(),
        builder,
        lambda: _adam(spec),
        steps_per_execution=int(spec["steps_per_execution"]),
    )
    return fit_side(
        lambda **kw: model.fit(dataset, shuffle=False, **kw),
        lambda: model.optimizer,
        int(spec["steps"]),
        int(spec["global_batch_size"]),
    )


def local_sides(
    spec: dict[str, Any], strategies: dict[str, Any], builder: Any, dataset: tf.data.Dataset
) -> dict[str, Side]:
    """The one process's sides (`LOCAL_SIDES`)."""
    pipeline = tfdist.PipelineOptions(
        split_at=[pipeline_cut(int(spec["model_options"]["depth"]))],
        micro_batches=int(spec["micro_batches"]),
        devices=STAGE_DEVICES,
    )
    trainers = {
        "trainer": _trainer(spec, builder, strategies["one_device"]),
        "mirrored": _trainer(spec, builder, strategies["mirrored"]),
        "sharded": _trainer(spec, builder, strategies["mirrored"], sharding="gradients"),
        "pipeline": _trainer(spec, builder, None, pipeline=pipeline),
    }
    sides = {"keras_fit": keras_side(spec, builder, dataset)}
    sides.update({name: trainer_side(spec, t, dataset) for name, t in trainers.items()})
    return {name: sides[name] for name in LOCAL_SIDES}


def worker_sides(
    spec: dict[str, Any], strategy: Any, builder: Any, dataset: tf.data.Dataset
) -> dict[str, Side]:
    """A worker's sides: the synchronous Trainer (``multi_worker``), then a side per name in
    ``spec["local_sgd"]`` (``local_sgd_h<H>``, ``diloco_h<H>``), Adam inside."""
    names = ("multi_worker", *spec.get("local_sgd", ()))
    return {
        name: trainer_side(
            spec, _trainer(spec, builder, strategy, **local_sgd_kwargs(name)), dataset
        )
        for name in names
    }


def local_sgd_kwargs(name: str) -> dict[str, Any]:
    """The Trainer's ``local_sgd`` keyword of a side (none for a synchronous one)."""
    return {"local_sgd": fits.local_sgd_option(name)} if fits.LOCAL_SIDE.fullmatch(name) else {}


def to_target_key(side: str) -> str:
    """The recorder's name of a local-SGD side's run to the target: ``gpt/<side>``."""
    return f"{TO_TARGET.split('/')[0]}/{side}"


def to_target(
    spec: dict[str, Any], strategy: Any, builder: Any, recorder: Recorder, side: str = ""
) -> Any:
    """The Trainer from fresh weights until the validation bits per byte reach the target;
    ``side``: a local-SGD side's name (its option, recorded as ``gpt/<side>``), or synchronous."""
    gbs = int(spec["global_batch_size"])
    data = {
        split: tfdist.data.load(
            "python_source",
            split=split,
            seed=int(spec["seed"]),
            seq_len=int(spec["seq_len"]),
            max_bytes=int(spec[f"{split}_bytes"]),
        )
        for split in ("train", "validation")
    }
    options = local_sgd_kwargs(side)
    trainer = _trainer(
        spec,
        builder,
        strategy,
        metrics=[BitsPerByte()],
        warmup_steps=int(spec["warmup_steps"]),
        **options,
    )
    task = {
        "name": TO_TARGET.split("/")[0],
        "target_accuracy": float(spec["target_bits_per_byte"]),
        "monitor": ("val_bits_per_byte", "min"),
        "steps_per_epoch": int(spec["eval_every"]),
        "max_epochs": int(spec["max_updates"]) // int(spec["eval_every"]),
    }
    rule = side or TO_TARGET.split("/")[1]
    return fit_to_target(trainer, (data["train"], data["validation"], gbs), task, rule, recorder)


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Times this launch's sides, then trains to the target; returns seconds, updates, points."""
    if spec["strategy"] == "multi_worker":
        strategies = {"multi_worker": tfdist.make_strategy("multi_worker")}
    else:  # mirrored first: it splits the CPU into 2 logical devices before TF initialises
        strategies = {"mirrored": tfdist.make_strategy("mirrored", num_devices=2)}
        strategies["one_device"] = tfdist.make_strategy("one_device", device="/cpu:0")
    seq_len, gbs = int(spec["seq_len"]), int(spec["global_batch_size"])
    builder = fits.seeded(
        lambda: tfdist.models.get(
            "gpt", input_shape=(seq_len,), num_classes=256, **spec["model_options"]
        ),
        int(spec["seed"]),
    )
    train = tfdist.data.load(
        "python_source", seq_len=seq_len, seed=int(spec["seed"]), max_bytes=spec["train_bytes"]
    )
    dataset = global_batches(train, gbs)
    if spec["strategy"] == "multi_worker":
        sides = worker_sides(spec, strategies["multi_worker"], builder, dataset)
        local_targets = list(spec.get("local_sgd_to_target", ()))
    else:
        sides = local_sides(spec, strategies, builder, dataset)
        local_targets = []
    recorder = Recorder(planned={TO_TARGET: 1, **{to_target_key(n): 1 for n in local_targets}})
    seconds, updates = time_sides(sides, recorder, int(spec["steps"]), int(spec["repeats"]))
    strategy = strategies.get("multi_worker") or strategies["one_device"]
    reached = to_target(spec, strategy, builder, recorder)
    local_reached = {n: to_target(spec, strategy, builder, recorder, n) for n in local_targets}
    return {
        "strategy": spec["strategy"],
        "num_replicas": strategy.num_replicas_in_sync,
        "steps": int(spec["steps"]),
        "global_batch_size": gbs,
        "seq_len": seq_len,
        "parameters": int(builder().count_params()),
        "seconds": seconds,
        "updates": updates,
        "to_target": reached,
        "to_target_local_sgd": local_reached,
        "records": recorder.records,
        "is_chief": reached["is_chief"],
    }
