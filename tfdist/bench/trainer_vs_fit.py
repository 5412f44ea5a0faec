"""``trainer_vs_fit``: examples/s of ``tfdist.Trainer.fit`` vs plain Keras ``model.fit``.

Both sides use the same mirrored strategy (2 virtual CPU devices), the same
model (``tfdist.models.get("cnn")`` on 8x8x1 inputs, 10 classes) from identical
initial weights, the same in-memory dataset of global batches, SGD, accuracy as
the metric, and the same ``steps_per_execution``. Keras's side is
``model.compile(...)`` + ``model.fit`` inside ``strategy.scope()``. Keras turns
XLA off on CPU-only machines and under tf.distribute, so neither side uses XLA.

Each side first runs one untimed epoch (tracing, iterator start-up), then the
timed ``fit(epochs=1, steps_per_epoch=N, verbose=0)`` calls alternate between
the sides; a whole ``fit`` call is timed, so per-call overheads count for both.

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


def compare(strategy: tf.distribute.Strategy, builder: Callable[[], keras.Model], dataset: tf.data.Dataset, *,
            global_batch_size: int, steps: int, repeats: int, steps_per_execution: int,
            optimizer: Callable[[], keras.optimizers.Optimizer], metrics: tuple[str, ...] = ("accuracy",),
            ) -> dict[str, Any]:
    """Times Trainer.fit against Keras fit on one strategy, alternating the sides.

    Args:
        strategy: The strategy both sides train under.
        builder: Zero-arg model builder (called once per side, in scope).
        dataset: Repeated ``tf.data.Dataset`` of global batches.
        global_batch_size: Examples per global batch of ``dataset``.
        steps: Batches per timed ``fit`` call.
        repeats: Timed calls per side; medians are reported.
        steps_per_execution: For both sides.
        optimizer: Zero-arg optimizer factory (one optimizer per side).
        metrics: Compiled metrics of both sides.

    Returns:
        ``trainer_examples_per_s``, ``keras_fit_examples_per_s`` (medians),
        ``ratio`` (trainer / keras) and the raw samples.
    """
    import tfdist

    trainer = tfdist.Trainer(builder, strategy=strategy, optimizer=optimizer(), loss=common.logits_loss(),
                             metrics=list(metrics), steps_per_execution=steps_per_execution)
    with strategy.scope():
        model = builder()
        model.compile(optimizer=optimizer(), loss=common.logits_loss(), metrics=list(metrics),
                      steps_per_execution=steps_per_execution)

    def trainer_fit(**kwargs: Any) -> Any:
        return trainer.fit(dataset, global_batch_size=global_batch_size, **kwargs)

    def keras_fit(**kwargs: Any) -> Any:
        return model.fit(dataset, **kwargs)

    sides = {
        "trainer": common.fit_throughput(trainer_fit, steps=steps, global_batch_size=global_batch_size),
        "keras_fit": common.fit_throughput(keras_fit, steps=steps, global_batch_size=global_batch_size),
    }
    for measure in sides.values():  # warm-up: traces, starts the input pipeline
        measure()
    samples = common.alternate(sides, repeats)
    trainer_rate = common.median(samples["trainer"])
    keras_rate = common.median(samples["keras_fit"])
    return {
        "trainer_examples_per_s": trainer_rate,
        "keras_fit_examples_per_s": keras_rate,
        "ratio": common.ratio(trainer_rate, keras_rate),
        "steps_per_execution": steps_per_execution,
        "samples": samples,
    }


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
                             repeats=repeats, steps_per_execution=spe,
                             optimizer=lambda: keras.optimizers.SGD(LEARNING_RATE))
    first, *others = STEPS_PER_EXECUTION
    result: dict[str, Any] = {**pairs[first], "goal": ">= 1.0"}
    for spe in others:
        result[f"steps_per_execution_{spe}"] = pairs[spe]
    result["config"] = {
        "strategy": "mirrored", "num_replicas": strategy.num_replicas_in_sync, "model": "cnn",
        "input_shape": list(INPUT_SHAPE), "num_classes": NUM_CLASSES, "global_batch_size": global_batch_size,
        "steps_per_fit": steps, "optimizer": f"SGD({LEARNING_RATE})", "metrics": ["accuracy"],
    }
    return result
