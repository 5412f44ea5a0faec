"""``bf16_vs_fp32``: Trainer step time in ``mixed_bfloat16`` vs ``float32``, against matmul peaks.

Four sides, measured in turn (A B C D, D C B A, ...) in one process:

* **float32** and **mixed_bfloat16**: ``tfdist.Trainer(precision=...)`` on the
  one_device strategy, the same dense-dominated MLP as ``mfu`` (1024 -> 3 x
  2048 -> 10, float32 logits) from identical initial weights, the same
  in-memory data (global batch 512), SGD. Under ``mixed_bfloat16`` the layers
  compute in bfloat16 and keep float32 variables. Step time = global batch /
  examples/s; ``ratio`` = float32 step time / bf16 step time (the speedup),
  goal >= 1.5.
* **float32_matmul** and **bfloat16_matmul**: the chained-matmul peak of
  ``mfu.matmul_peak`` in each dtype (bf16: ``tf.matmul`` of bfloat16 tensors).
  ``matmul_speedup_ratio`` = bf16 / fp32 GFLOP/s is what the hardware (and
  TF's kernels) offer; ``realised_ratio`` = ``ratio / matmul_speedup_ratio`` is
  the share of it training gets.

The bf16 speedup depends on the CPU: AMX tiles (``amx_bf16``/``amx_tile``) are
far faster than AVX-512 BF16 dot products (``avx512_bf16``), and without either
bfloat16 is only emulated. ``cpu`` records which of these flags
``/proc/cpuinfo`` shows, and whether TF runs with oneDNN.

    tfdist bench --benchmarks=bf16_vs_fp32
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import keras
import tensorflow as tf

from tfdist._compat.tf_internals.bench import onednn_enabled
from tfdist.bench.harness import common, fits, timing
from tfdist.bench.in_process import mfu

BF16_CPU_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16")
# The vector units besides: the two machine kinds differ here (AVX-512 with bf16, or AVX2 only).
VECTOR_CPU_FLAGS = ("avx2", "avx512f")
INPUT_FEATURES = mfu.INPUT_FEATURES
HIDDEN_UNITS = mfu.HIDDEN_UNITS
NUM_CLASSES = mfu.NUM_CLASSES
GLOBAL_BATCH_SIZE = mfu.GLOBAL_BATCH_SIZE
STEPS_PER_FIT = mfu.STEPS_PER_FIT
LEARNING_RATE = mfu.LEARNING_RATE
MATMUL_SIZE = mfu.MATMUL_SIZE
MATMUL_ITERATIONS = mfu.MATMUL_ITERATIONS
PRECISIONS = ("float32", "mixed_bfloat16")


def cpu_features(path: str = "/proc/cpuinfo") -> dict[str, Any]:
    """The bf16 and vector CPU flags ``path`` lists (None if unreadable), the CPU model, oneDNN."""
    flags: set[str] | None = None
    model = None
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "flags" and flags is None:
                    flags = set(value.split())
                elif key == "model name" and model is None:
                    model = value.strip()
    except OSError:
        pass
    features: dict[str, Any] = {
        flag: None if flags is None else flag in flags
        for flag in (*BF16_CPU_FLAGS, *VECTOR_CPU_FLAGS)
    }
    features["model_name"] = model
    features["onednn_enabled"] = onednn_enabled()
    features["TF_ENABLE_ONEDNN_OPTS"] = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    return features


def precision_sides(
    strategy: tf.distribute.Strategy,
    builder: Callable[[], keras.Model],
    dataset: Any,
    *,
    global_batch_size: int,
    steps: int,
) -> tuple[dict[str, fits.FitThroughput], dict[str, list[str]]]:
    """One Trainer side per precision of `PRECISIONS`, and its Dense layers' compute dtypes.

    Returns:
        ``(sides, compute_dtypes)``: precision -> its Trainer side, and precision
        -> the sorted compute dtypes of the model's Dense layers.
    """
    import tfdist

    sides, compute_dtypes = {}, {}
    for precision in PRECISIONS:
        trainer = tfdist.Trainer(
            builder,
            strategy=strategy,
            optimizer=keras.optimizers.SGD(LEARNING_RATE),
            loss=fits.logits_loss(),
            precision=precision,
        )
        sides[precision] = fits.trainer_side(
            trainer, dataset, global_batch_size=global_batch_size, steps=steps
        )
        # What the Dense layers really computed in (the logits stay float32 on both sides).
        compute_dtypes[precision] = sorted(
            {
                layer.compute_dtype
                for layer in trainer.model.layers
                if isinstance(layer, keras.layers.Dense)
            }
        )
    return sides, compute_dtypes


def workload_config(
    features: int,
    hidden: Sequence[int],
    global_batch_size: int,
    steps: int,
    n: int,
    iterations: int,
) -> dict[str, Any]:
    """The ``config`` entry of the result: the workload both precisions ran."""
    return {
        "strategy": "one_device",
        "precisions": list(PRECISIONS),
        "model": "mlp",
        "input_shape": [features],
        "hidden_units": list(hidden),
        "num_classes": NUM_CLASSES,
        "global_batch_size": global_batch_size,
        "steps_per_fit": steps,
        "optimizer": f"SGD({LEARNING_RATE})",
        "step_s_formula": "global_batch_size / median examples/s",
        "matmul": {
            "n": n,
            "iterations": iterations,
            "dtypes": ["float32", "bfloat16"],
            "gflops_formula": "2 * n**3 * iterations / seconds / 1e9",
        },
    }


@common.register("bf16_vs_fp32")
def bf16_vs_fp32(repeats: int, quick: bool) -> dict[str, Any]:
    """Trainer step time, mixed_bfloat16 vs float32 (one_device, wide MLP); bf16/fp32 matmul peaks.

    Returns:
        ``float32_step_s``, ``bf16_step_s`` (from median examples/s), ``ratio``
        (float32 / bf16 step time), ``goal``, ``float32_matmul_gflops``,
        ``bf16_matmul_gflops``, ``matmul_speedup_ratio``, ``realised_ratio``,
        the examples/s of both sides, ``cpu`` (see `cpu_features`), the
        raw samples and the config.
    """
    strategy, n, iterations, features, hidden, global_batch_size, steps, dataset, build, builder = (
        mfu.wide_mlp_setup(quick)
    )
    sides: dict[str, timing.Side] = {
        "float32_matmul": mfu.matmul_peak(n, iterations, dtype=tf.float32),
        "bfloat16_matmul": mfu.matmul_peak(n, iterations, dtype=tf.bfloat16),
    }
    fit_sides, compute_dtypes = precision_sides(
        strategy, builder, dataset, global_batch_size=global_batch_size, steps=steps
    )
    sides.update(fit_sides)
    samples = timing.alternate(sides, repeats)
    rates = {precision: samples.median(precision) for precision in PRECISIONS}
    fp32_step = timing.ratio(global_batch_size, rates["float32"])
    bf16_step = timing.ratio(global_batch_size, rates["mixed_bfloat16"])
    fp32_peak = samples.median("float32_matmul")
    bf16_peak = samples.median("bfloat16_matmul")
    speedup = timing.ratio(fp32_step, bf16_step)
    matmul_speedup = timing.ratio(bf16_peak, fp32_peak)
    return {
        "float32_step_s": fp32_step,
        "bf16_step_s": bf16_step,
        "ratio": speedup,
        "goal": ">= 1.5",
        "float32_matmul_gflops": fp32_peak,
        "bf16_matmul_gflops": bf16_peak,
        "matmul_speedup_ratio": matmul_speedup,
        "realised_ratio": timing.ratio(speedup, matmul_speedup),
        "float32_examples_per_s": rates["float32"],
        "bf16_examples_per_s": rates["mixed_bfloat16"],
        "fit_overhead_s": {name: timing.median(side.overheads) for name, side in fit_sides.items()},
        "updates_per_call": {name: list(side.updates) for name, side in fit_sides.items()},
        "compute_dtypes": compute_dtypes,
        "cpu": cpu_features(),
        "others_cpu_max": samples.max_others_cpu(),
        "samples": samples.as_dict(),
        "config": workload_config(features, hidden, global_batch_size, steps, n, iterations),
    }
