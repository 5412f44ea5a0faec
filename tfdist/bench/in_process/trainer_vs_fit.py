"""``trainer_vs_fit``: examples/s of ``tfdist.Trainer.fit`` vs plain Keras ``model.fit``.

Both sides use the same mirrored strategy (2 virtual CPU devices), the same
model (``tfdist.models.get("cnn")`` on 8x8x1 inputs, 10 classes) from identical
initial weights, the same in-memory dataset of global batches (global batch
256), SGD, accuracy as the metric, and the same ``steps_per_execution`` (1,
then again with 8). Keras turns XLA off on CPU-only machines and under
tf.distribute, so neither side uses XLA.

Each side first runs one untimed epoch (tracing, input start-up); then the
timed ``fit(epochs=1, steps_per_epoch=N, verbose=0)`` calls alternate between
the sides. The steps of each call are timed (see ``fits.FitThroughput``); the
rest of the call is reported apart, as ``fit_overhead_s``.

    tfdist bench --benchmarks=trainer_vs_fit
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from tfdist.bench.harness import common, fits, timing

STEPS_PER_FIT = 64
STEPS_PER_EXECUTION = (1, 8)
METRICS = ("accuracy",)


def compare(
    strategy: tf.distribute.Strategy,
    builder: Callable[[], keras.Model],
    dataset: tf.data.Dataset,
    *,
    global_batch_size: int,
    steps: int,
    repeats: int,
    steps_per_execution: int,
) -> dict[str, Any]:
    """Times Trainer.fit against Keras fit (SGD, accuracy), alternating the sides.

    Returns:
        ``trainer_examples_per_s``, ``keras_fit_examples_per_s`` (medians),
        ``ratio`` (trainer / keras), per-call overheads and the raw samples.
    """
    sides = fits.fit_sides(
        strategy,
        builder,
        dataset,
        global_batch_size=global_batch_size,
        steps=steps,
        optimizer=lambda: keras.optimizers.SGD(fits.CNN_LEARNING_RATE),
        metrics=METRICS,
        steps_per_execution=steps_per_execution,
    )
    samples = timing.alternate(sides, repeats)
    return {
        **fits.fit_summary(samples, sides),
        "steps_per_execution": steps_per_execution,
        "others_cpu_max": samples.max_others_cpu(),
        "samples": samples.as_dict(),
    }


@common.register("trainer_vs_fit")
def trainer_vs_fit(repeats: int, quick: bool) -> dict[str, Any]:
    """Trainer.fit vs Keras fit on MirroredStrategy (2 CPU devices), CNN, global batch 256.

    Returns:
        ``trainer_examples_per_s``, ``keras_fit_examples_per_s``, ``ratio`` and
        ``goal`` for ``steps_per_execution=1``; the same figures for
        ``steps_per_execution=8`` under ``"steps_per_execution_8"``.
    """
    strategy = common.strategy("mirrored")
    run = fits.cnn_run(quick, STEPS_PER_FIT)
    pairs = {
        spe: compare(
            strategy,
            run.builder,
            run.dataset,
            global_batch_size=run.global_batch_size,
            steps=run.steps,
            repeats=repeats,
            steps_per_execution=spe,
        )
        for spe in STEPS_PER_EXECUTION
    }
    first, *others = STEPS_PER_EXECUTION
    result: dict[str, Any] = {**pairs[first], "goal": ">= 1.0"}
    for spe in others:
        result[f"steps_per_execution_{spe}"] = pairs[spe]
    result["others_cpu_max"] = timing.nanmax(pair["others_cpu_max"] for pair in pairs.values())
    result["config"] = {
        **run.config(strategy),
        "steps_per_fit": run.steps,
        "metrics": list(METRICS),
    }
    return result
