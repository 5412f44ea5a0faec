"""``trainer_vs_fit``: examples/s of ``tfdist.Trainer.fit`` vs plain Keras ``model.fit``.

Both sides use the same mirrored strategy (2 virtual CPU devices), the same
model (``tfdist.models.get("cnn")`` on 8x8x1 inputs, 10 classes) from identical
initial weights, the same in-memory dataset of global batches, SGD, accuracy as
the metric, and the same ``steps_per_execution``. Keras's side is
``model.compile(...)`` + ``model.fit`` inside ``strategy.scope()``. Keras turns
XLA off on CPU-only machines and under tf.distribute, so neither side uses XLA.

Each side first runs one untimed epoch (tracing, iterator start-up), then the
timed ``fit(epochs=1, steps_per_epoch=N, verbose=0)`` calls alternate between
the sides. The steps of each call are timed (see ``common.FitThroughput``);
the rest of the call is reported apart, as ``fit_overhead_s``.

    tfdist bench --benchmarks=trainer_vs_fit
"""
from __future__ import annotations

from typing import Any, Callable

import keras
import tensorflow as tf

from tfdist.bench import common

INPUT_SHAPE = (8, 8, 1)
NUM_CLASSES = 10
GLOBAL_BATCH_SIZE = 256
LEARNING_RATE = 0.01
STEPS_PER_EXECUTION = (1, 8)
METRICS = ("accuracy",)


def compare(strategy: tf.distribute.Strategy, builder: Callable[[], keras.Model], dataset: tf.data.Dataset, *,
            global_batch_size: int, steps: int, repeats: int, steps_per_execution: int) -> dict[str, Any]:
    """Times Trainer.fit against Keras fit (SGD, accuracy), alternating the sides.

    Returns:
        ``trainer_examples_per_s``, ``keras_fit_examples_per_s`` (medians),
        ``ratio`` (trainer / keras), per-call overheads and the raw samples.
    """
    sides = common.fit_sides(strategy, builder, dataset, global_batch_size=global_batch_size, steps=steps,
                             optimizer=lambda: keras.optimizers.SGD(LEARNING_RATE), metrics=METRICS,
                             steps_per_execution=steps_per_execution)
    samples = common.alternate(sides, repeats)
    return {**common.fit_summary(samples, sides), "steps_per_execution": steps_per_execution,
            "samples": samples.as_dict()}


@common.register("trainer_vs_fit")
def trainer_vs_fit(repeats: int, quick: bool) -> dict[str, Any]:
    """Trainer.fit vs Keras fit on MirroredStrategy (2 CPU devices), CNN, global batch 256.

    Returns:
        ``trainer_examples_per_s``, ``keras_fit_examples_per_s``, ``ratio`` and
        ``goal`` for ``steps_per_execution=1``, and the same figures for
        ``steps_per_execution=8`` under ``"steps_per_execution_8"``.
    """
    import tfdist

    strategy = common.strategy("mirrored")
    global_batch_size = 32 if quick else GLOBAL_BATCH_SIZE
    steps = 8 if quick else 48
    dataset = common.make_dataset(INPUT_SHAPE, NUM_CLASSES, global_batch_size=global_batch_size, num_batches=8)

    def build() -> keras.Model:
        return tfdist.models.get("cnn", input_shape=INPUT_SHAPE, num_classes=NUM_CLASSES)

    builder = common.with_weights(build, common.initial_weights(build))
    pairs = {}
    for spe in STEPS_PER_EXECUTION:
        pairs[spe] = compare(strategy, builder, dataset, global_batch_size=global_batch_size, steps=steps,
                             repeats=repeats, steps_per_execution=spe)
    first, *others = STEPS_PER_EXECUTION
    result: dict[str, Any] = {**pairs[first], "goal": ">= 1.0"}
    for spe in others:
        result[f"steps_per_execution_{spe}"] = pairs[spe]
    result["config"] = {
        "strategy": "mirrored", "num_replicas": strategy.num_replicas_in_sync, "model": "cnn",
        "input_shape": list(INPUT_SHAPE), "num_classes": NUM_CLASSES, "global_batch_size": global_batch_size,
        "steps_per_fit": steps, "optimizer": f"SGD({LEARNING_RATE})", "metrics": list(METRICS),
    }
    return result
