"""What every benchmark shares: the registry, the strategies, alternating timing.

A benchmark is a function ``(repeats, quick) -> dict`` registered under a
snake_case name. It lives in its own module under ``tfdist/bench/`` and is
listed in ``tfdist.bench.runner.BUILTIN_MODULES``::

    @common.register("my_bench")
    def my_bench(repeats: int, quick: bool) -> dict: ...

Strategies are created once per process by :func:`init_strategies`, which the
runner calls before any other TensorFlow work (MirroredStrategy on the CPU needs
virtual devices, which exist only if they are configured before TF initialises).
"""
from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable, Mapping

import keras
import numpy as np
import tensorflow as tf

from tfdist.config import invalid_argument

BenchmarkFn = Callable[[int, bool], dict[str, Any]]

# Replicas of the mirrored strategy the benchmarks use (virtual CPU devices).
MIRRORED_DEVICES = 2

_REGISTRY: dict[str, BenchmarkFn] = {}
_STRATEGIES: dict[str, tf.distribute.Strategy] = {}


def register(name: str) -> Callable[[BenchmarkFn], BenchmarkFn]:
    """Decorator: registers ``fn(repeats, quick) -> dict`` under ``name``."""

    def wrap(fn: BenchmarkFn) -> BenchmarkFn:
        _REGISTRY[name] = fn
        return fn

    return wrap


def registry() -> Mapping[str, BenchmarkFn]:
    """The registered benchmarks, name -> function (read-only view)."""
    return dict(_REGISTRY)


def init_strategies() -> dict[str, tf.distribute.Strategy]:
    """Creates (once) the strategies the benchmarks share. Call before other TF work.

    Returns:
        ``{"mirrored": <MirroredStrategy over 2 CPU devices>, "one_device": ...}``.

    Raises:
        ValueError: If TensorFlow was initialised with fewer than 2 CPU devices.
    """
    from tfdist.strategies.factory import make_strategy

    if not _STRATEGIES:
        # Mirrored first: it splits the CPU into virtual devices before TF initialises.
        _STRATEGIES["mirrored"] = make_strategy("mirrored", num_devices=MIRRORED_DEVICES)
        _STRATEGIES["one_device"] = make_strategy("one_device", device="/cpu:0")
    return dict(_STRATEGIES)


def strategy(kind: str) -> tf.distribute.Strategy:
    """Returns the shared strategy ``kind`` ("mirrored" or "one_device")."""
    strategies = init_strategies()
    if kind not in strategies:
        raise invalid_argument("strategy", kind, sorted(strategies))
    return strategies[kind]


def alternate(sides: Mapping[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """Runs each side ``repeats`` times, interleaved A B, B A, A B, ...

    Interleaving (and reversing the order every round) spreads the machine's
    slow drifts and bursts evenly over the sides.

    Args:
        sides: Name -> a zero-arg callable that runs one timed measurement and
            returns its value (e.g. examples per second).
        repeats: Measurements per side.

    Returns:
        Name -> the ``repeats`` measurements, in the order taken.
    """
    names = list(sides)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in (names if r % 2 == 0 else names[::-1]):
            samples[name].append(float(sides[name]()))
    return samples


def median(values: list[float]) -> float:
    """The median of ``values`` (NaN for none)."""
    return float(statistics.median(values)) if values else math.nan


def ratio(numerator: float, denominator: float) -> float:
    """``numerator / denominator``, NaN when the denominator is not positive."""
    return float(numerator / denominator) if denominator > 0 else math.nan


def timed(fn: Callable[[], Any]) -> float:
    """Seconds ``fn()`` takes by ``time.perf_counter`` (fn must block until done)."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def make_dataset(input_shape: tuple[int, ...], num_classes: int, *, global_batch_size: int,
                 num_batches: int, seed: int = 0) -> tf.data.Dataset:
    """An in-memory, repeated ``tf.data.Dataset`` of ``num_batches`` distinct global batches.

    Random features and labels: throughput does not depend on what is learned.
    """
    rng = np.random.default_rng(seed)
    n = global_batch_size * num_batches
    x = rng.normal(size=(n, *input_shape)).astype("float32")
    y = rng.integers(0, num_classes, size=(n,)).astype("int32")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch_size, drop_remainder=True)
    return ds.cache().repeat().prefetch(tf.data.AUTOTUNE)


def initial_weights(build: Callable[[], keras.Model], seed: int = 0) -> list[np.ndarray]:
    """The weights ``build()`` starts from under ``seed`` (built outside any strategy)."""
    keras.utils.set_random_seed(seed)
    return build().get_weights()


def with_weights(build: Callable[[], keras.Model], weights: list[np.ndarray]) -> Callable[[], keras.Model]:
    """A zero-arg builder that builds the model and loads ``weights``."""

    def builder() -> keras.Model:
        model = build()
        model.set_weights(weights)
        return model

    return builder


def logits_loss() -> keras.losses.Loss:
    """The loss of every benchmark: sparse categorical cross-entropy on logits."""
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def fit_throughput(fit: Callable[..., Any], *, steps: int, global_batch_size: int) -> Callable[[], float]:
    """A measurement: one timed ``fit(epochs=1, steps_per_epoch=steps)``, in examples/s."""

    def measure() -> float:
        seconds = timed(lambda: fit(epochs=1, steps_per_epoch=steps, verbose=0))
        return steps * global_batch_size / seconds

    return measure
