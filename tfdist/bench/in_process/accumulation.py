"""``accumulation``: examples/s of Trainer with gradient accumulation vs without.

Both sides are ``tfdist.Trainer`` on the same mirrored strategy (2 virtual CPU
devices), the same model (``tfdist.models.get("cnn")`` on 8x8x1 inputs, 10
classes) from identical initial weights, the same in-memory dataset of global
batches (global batch 256 per micro-batch), SGD, no metrics, the same number
of micro-batches per timed ``fit`` call and the same micro-batches per
``tf.function`` call (``steps_per_execution=4``):

* **accumulating**: ``accumulation_steps=4``: each call runs 4 micro-batches
  that sum their gradients locally, then one all-reduce and one optimizer
  update;
* **plain**: ``accumulation_steps=1``: each call runs 4 micro-batches, each
  with its own all-reduce and update.

Accumulation does the same forward and backward work with a quarter of the
all-reduces and updates, so it should not be slower: ratio = accumulating /
plain examples/s, goal >= 0.95. ``steps_per_epoch`` counts micro-batches, so
examples/s = micro-batches * 256 / seconds on both sides. The optimizer
updates each side actually made per call are recorded as a check.

    tfdist bench --benchmarks=accumulation
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from tfdist.bench.harness import common, fits, timing

ACCUMULATION_STEPS = 4
STEPS_PER_EXECUTION = 4
MICRO_BATCHES_PER_FIT = 64
SIDES = {"accumulating": ACCUMULATION_STEPS, "plain": 1}  # side -> accumulation_steps


def side_trainers(
    strategy: tf.distribute.Strategy, builder: Callable[[], keras.Model]
) -> dict[str, Any]:
    """One Trainer per side of `SIDES`, on the same CNN with the same initial weights."""
    import tfdist

    return {
        name: tfdist.Trainer(
            builder,
            strategy=strategy,
            optimizer=keras.optimizers.SGD(fits.CNN_LEARNING_RATE),
            loss=fits.logits_loss(),
            accumulation_steps=k,
            steps_per_execution=STEPS_PER_EXECUTION,
        )
        for name, k in SIDES.items()
    }


@common.register("accumulation")
def accumulation(repeats: int, quick: bool) -> dict[str, Any]:
    """Trainer(accumulation_steps=4) vs accumulation_steps=1, mirrored over 2 CPU devices, CNN.

    Returns:
        ``accumulating_examples_per_s``, ``plain_examples_per_s`` (medians),
        ``ratio`` (accumulating / plain), ``goal``, per-call overheads,
        ``updates_per_fit`` (optimizer updates per timed call, measured), the
        raw samples and the config.
    """
    strategy = common.strategy("mirrored")
    run = fits.cnn_run(quick, MICRO_BATCHES_PER_FIT)
    global_batch_size, micro_batches = run.global_batch_size, run.steps
    trainers = side_trainers(strategy, run.builder)
    sides = {
        name: fits.trainer_side(
            trainer, run.dataset, global_batch_size=global_batch_size, steps=micro_batches
        )
        for name, trainer in trainers.items()
    }
    samples = timing.alternate(sides, repeats)
    rates = {name: samples.median(name) for name in sides}
    calls = {name: 1 + len(samples.values[name]) for name in sides}  # + the warm-up
    return {
        "accumulating_examples_per_s": rates["accumulating"],
        "plain_examples_per_s": rates["plain"],
        "ratio": timing.ratio(rates["accumulating"], rates["plain"]),
        "goal": ">= 0.95",
        "fit_overhead_s": {name: timing.median(side.overheads) for name, side in sides.items()},
        "updates_per_fit": {
            name: int(trainer.model.optimizer.iterations.numpy()) / calls[name]
            for name, trainer in trainers.items()
        },
        # Counted per timed call (fits.FitThroughput), so a check can see each call's own updates.
        "updates_per_call": {name: list(side.updates) for name, side in sides.items()},
        "others_cpu_max": samples.max_others_cpu(),
        "samples": samples.as_dict(),
        "config": {
            **run.config(strategy),
            "micro_batches_per_fit": micro_batches,
            "accumulation_steps": dict(SIDES),
            "steps_per_execution": STEPS_PER_EXECUTION,
            "metrics": [],
        },
    }
