"""``mfu``: model FLOP utilisation of float32 training, Trainer and Keras fit.

MFU = training FLOP/s / the machine's float32 matmul peak, both measured here:

* **Peak**: a ``tf.function`` runs a dependency-*chained* loop
  ``x = x @ w`` of ``n x n`` float32 matmuls (``w`` orthogonal, so ``x`` keeps
  its norm and stays finite). Chaining matters: Grappler merges identical
  independent ops, so a loop of ``tf.matmul(a, b)`` would compute one product.
  GFLOP/s = ``2 * n**3 * iterations / seconds``.
* **Training FLOP/s** of a dense-dominated MLP on the one_device strategy:
  ``6 * sum(in * out over Dense layers) * examples/s``. Per example and
  multiply-add of a Dense kernel, the forward matmul costs 2 FLOPs and the
  backward pass 4 (one matmul for the gradient w.r.t. the layer input, one for
  the gradient w.r.t. the kernel). Bias, activation, loss and optimizer
  updates are O(units) or O(parameters) and left out, as is usual. As the
  usual ``6N`` convention does, this counts the first layer's input gradient,
  which TF prunes (nothing needs it): for the default MLP the work done is
  about 7% less than counted (``2 * 1024 * 2048`` of ``6 * 10.5M`` per example).

The peak and the two training sides are measured in turn (A B C, C B A, ...)
so that the machine's drifts hit them alike; medians of the clean
measurements are reported (see ``timing``).

    tfdist bench --benchmarks=mfu
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tfdist.bench.harness import common, fits, timing

MATMUL_SIZE = 2048
MATMUL_ITERATIONS = 10
INPUT_FEATURES = 1024
HIDDEN_UNITS = (2048, 2048, 2048)
NUM_CLASSES = 10
GLOBAL_BATCH_SIZE = 512
STEPS_PER_FIT = 6
LEARNING_RATE = 0.01


def matmul_peak(
    n: int, iterations: int, *, dtype: tf.DType = tf.float32, device: str = "/cpu:0", seed: int = 0
) -> timing.Side:
    """A measurement of matmul GFLOP/s in ``dtype``: one call of a chained-matmul loop.

    The returned callable traces and runs the loop once when created (warm-up);
    each call then times one run and returns ``(GFLOP/s, timing)``. With
    ``tf.bfloat16`` both operands are bfloat16 tensors (``tf.matmul`` then
    takes the CPU's bf16 path, if it has one); the sum of squares at the end is
    taken in float32.

    Raises:
        FloatingPointError: If the chain's result is not finite.
    """
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(n, n)))
    with tf.device(device):
        w = tf.cast(tf.constant(q.astype("float32")), dtype)
        x0 = tf.cast(tf.constant((rng.normal(size=(n, n)) / np.sqrt(n)).astype("float32")), dtype)

    @tf.function
    def chain(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
        with tf.device(device):
            for _ in tf.range(iterations):
                x = tf.matmul(x, w)
            # = ||x0||^2 since w is orthogonal (up to rounding in bf16)
            return tf.reduce_sum(tf.square(tf.cast(x, tf.float32)))

    def run_once() -> float:
        value = float(chain(x0, w).numpy())
        if not np.isfinite(value):
            raise FloatingPointError(f"chained matmul overflowed: sum of squares {value}")
        return value

    run_once()

    def measure() -> tuple[float, timing.Timing]:
        took = timing.timed(run_once)
        return 2.0 * n**3 * iterations / took.seconds / 1e9, took

    return measure


def _layers(model: keras.Model) -> Iterator[keras.layers.Layer]:
    """Every layer of ``model``, those of nested models included (public ``Model.layers`` only)."""
    for layer in model.layers:
        yield layer
        if isinstance(layer, keras.Model):
            yield from _layers(layer)


def dense_flops_per_example(model: keras.Model) -> int:
    """Training FLOPs per example of ``model``'s Dense layers: ``6 * sum(in * out)``.

    Counts the Dense layers of the model and of the models nested in it; a
    Dense layer held inside a custom (non-Model) layer is not seen. The bench's
    MLP has none.
    """
    macs = sum(
        int(np.prod(layer.kernel.shape))
        for layer in _layers(model)
        if isinstance(layer, keras.layers.Dense)
    )
    return 6 * macs


def wide_mlp_setup(quick: bool) -> tuple:
    """The wide-MLP workload shared by ``mfu`` and ``bf16_vs_fp32``.

    Returns:
        ``(strategy, matmul_size, matmul_iterations, input_features, hidden_units,
        global_batch_size, steps, dataset, build, builder)``; ``builder`` builds
        the model with fixed initial weights.
    """
    import tfdist

    strategy = common.strategy("one_device")
    n, iterations = (256, 4) if quick else (MATMUL_SIZE, MATMUL_ITERATIONS)
    features, hidden = (64, (128, 128)) if quick else (INPUT_FEATURES, HIDDEN_UNITS)
    global_batch_size = 64 if quick else GLOBAL_BATCH_SIZE
    steps = 4 if quick else STEPS_PER_FIT
    dataset = fits.make_dataset(
        (features,), NUM_CLASSES, global_batch_size=global_batch_size, num_batches=4
    )

    def build() -> keras.Model:
        return tfdist.models.get(
            "mlp", input_shape=(features,), num_classes=NUM_CLASSES, hidden_units=hidden
        )

    builder = fits.seeded(build)
    return (
        strategy,
        n,
        iterations,
        features,
        hidden,
        global_batch_size,
        steps,
        dataset,
        build,
        builder,
    )


@common.register("mfu")
def mfu(repeats: int, quick: bool) -> dict[str, Any]:
    """Float32 MFU of Trainer.fit and Keras fit on a wide MLP, one_device strategy.

    Returns:
        ``matmul_peak_gflops``, ``trainer_gflops``, ``keras_fit_gflops``,
        ``trainer_mfu``, ``keras_fit_mfu``, ``mfu_ratio`` (trainer / keras MFU),
        ``goal``, the examples/s of both sides, the raw samples and the config.
    """
    strategy, n, iterations, features, hidden, global_batch_size, steps, dataset, build, builder = (
        wide_mlp_setup(quick)
    )
    flops_per_example = dense_flops_per_example(build())

    sides: dict[str, timing.Side] = {"matmul": matmul_peak(n, iterations)}
    fit_sides = fits.fit_sides(
        strategy,
        builder,
        dataset,
        global_batch_size=global_batch_size,
        steps=steps,
        optimizer=lambda: keras.optimizers.SGD(LEARNING_RATE),
    )
    sides.update(fit_sides)
    samples = timing.alternate(sides, repeats)
    rates = fits.fit_summary(samples, fit_sides)
    peak = samples.median("matmul")
    trainer_gflops = flops_per_example * rates["trainer_examples_per_s"] / 1e9
    keras_gflops = flops_per_example * rates["keras_fit_examples_per_s"] / 1e9
    trainer_mfu = timing.ratio(trainer_gflops, peak)
    keras_mfu = timing.ratio(keras_gflops, peak)
    return {
        "matmul_peak_gflops": peak,
        "trainer_gflops": trainer_gflops,
        "keras_fit_gflops": keras_gflops,
        "trainer_mfu": trainer_mfu,
        "keras_fit_mfu": keras_mfu,
        "mfu_ratio": timing.ratio(trainer_mfu, keras_mfu),
        "goal": ">= 0.60",
        "goals": {"trainer_mfu": ">= 0.60"},  # the Trainer's; Keras's fit is the reference
        "trainer_examples_per_s": rates["trainer_examples_per_s"],
        "keras_fit_examples_per_s": rates["keras_fit_examples_per_s"],
        "fit_overhead_s": rates["fit_overhead_s"],
        "others_cpu_max": samples.max_others_cpu(),
        "samples": samples.as_dict(),
        "config": {
            "strategy": "one_device",
            "precision": "float32",
            "model": "mlp",
            "input_shape": [features],
            "hidden_units": list(hidden),
            "num_classes": NUM_CLASSES,
            "global_batch_size": global_batch_size,
            "steps_per_fit": steps,
            "optimizer": f"SGD({LEARNING_RATE})",
            "flops_per_example": flops_per_example,
            "flops_formula": "6 * sum(in * out over Dense kernels) per example",
            "matmul": {
                "n": n,
                "iterations": iterations,
                "dtype": "float32",
                "gflops_formula": "2 * n**3 * iterations / seconds / 1e9",
            },
        },
    }
