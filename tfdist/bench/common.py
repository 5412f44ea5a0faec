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

import dataclasses
import math
import statistics
import time
from typing import Any, Callable, Mapping, Sequence

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


@dataclasses.dataclass
class Samples:
    """Measurements per side, in the order taken.

    ``values`` are what the sides returned; ``cpu_share`` is this process's CPU
    seconds per wall second during each measurement (about the core count when
    a compute-bound side has the machine to itself; less when others compete).
    """

    values: dict[str, list[float]]
    cpu_share: dict[str, list[float]]

    def median(self, name: str) -> float:
        return median(self.values[name])

    def as_dict(self) -> dict[str, Any]:
        return {"values": self.values, "cpu_share": self.cpu_share}


def alternate(sides: Mapping[str, Callable[[], float]], repeats: int) -> Samples:
    """Runs each side ``repeats`` times, interleaved A B, B A, A B, ...

    Interleaving (and reversing the order every round) spreads the machine's
    slow drifts and bursts evenly over the sides.

    Args:
        sides: Name -> a zero-arg callable that runs one timed measurement and
            returns its value (e.g. examples per second).
        repeats: Measurements per side.

    Returns:
        The ``repeats`` measurements of every side.
    """
    names = list(sides)
    samples = Samples({name: [] for name in names}, {name: [] for name in names})
    for r in range(repeats):
        for name in (names if r % 2 == 0 else names[::-1]):
            wall, cpu = time.perf_counter(), time.process_time()
            samples.values[name].append(float(sides[name]()))
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            samples.cpu_share[name].append(round(cpu / wall, 2) if wall > 0 else math.nan)
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


class _StepWindow(keras.callbacks.Callback):
    """Records when the first batch starts and when the epoch's results are in."""

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.first_batch = None
        self.epoch_end = None

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if self.first_batch is None:
            self.first_batch = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.epoch_end = time.perf_counter()  # after the last step's logs were fetched


class FitThroughput:
    """A measurement: one ``fit(epochs=1, steps_per_epoch=steps)`` call, in examples/s.

    Only the steps are timed, from the first batch's start to the epoch's end
    (both loops fetch the last step's results before ``on_epoch_end``). Setup
    and teardown of the call (iterator creation, and destruction, which on this
    TF can stall for up to seconds) are left out; their seconds are kept in
    :attr:`overheads`. The timing callback overrides no ``on_*_batch_end``
    hook, so it changes nothing in how either loop dispatches steps.

    Args:
        fit: ``fit(epochs=, steps_per_epoch=, verbose=, callbacks=)`` of one side.
        steps: Batches per call.
        global_batch_size: Examples per batch.
    """

    def __init__(self, fit: Callable[..., Any], *, steps: int, global_batch_size: int) -> None:
        self.fit = fit
        self.steps = steps
        self.global_batch_size = global_batch_size
        self.overheads: list[float] = []

    def __call__(self) -> float:
        window = _StepWindow()
        start = time.perf_counter()
        self.fit(epochs=1, steps_per_epoch=self.steps, verbose=0, callbacks=[window])
        total = time.perf_counter() - start
        seconds = window.epoch_end - window.first_batch
        self.overheads.append(total - seconds)
        return self.steps * self.global_batch_size / seconds


def fit_sides(strategy: tf.distribute.Strategy, builder: Callable[[], keras.Model], dataset: tf.data.Dataset, *,
              global_batch_size: int, steps: int, optimizer: Callable[[], keras.optimizers.Optimizer],
              metrics: Sequence[str] = (), steps_per_execution: int = 1) -> dict[str, FitThroughput]:
    """The two sides, "trainer" and "keras_fit", warmed up: same strategy, model, data and options.

    The Trainer side is ``tfdist.Trainer(builder, ...).fit(dataset, ...)``; the
    Keras side is ``builder()`` + ``model.compile(...)`` in ``strategy.scope()``,
    then ``model.fit(dataset, ...)``. Each runs one untimed epoch of ``steps``
    (tracing, input pipeline start-up) before it is returned.

    Args:
        strategy: The strategy both sides train under.
        builder: Zero-arg model builder, called once per side in scope; it
            should load fixed weights so that both sides start alike.
        dataset: Repeated ``tf.data.Dataset`` of global batches.
        global_batch_size: Examples per global batch of ``dataset``.
        steps: Batches per timed ``fit`` call.
        optimizer: Zero-arg optimizer factory (one optimizer per side).
        metrics: Compiled metrics of both sides.
        steps_per_execution: For both sides.
    """
    import tfdist

    trainer = tfdist.Trainer(builder, strategy=strategy, optimizer=optimizer(), loss=logits_loss(),
                             metrics=list(metrics), steps_per_execution=steps_per_execution)
    with strategy.scope():
        model = builder()
        model.compile(optimizer=optimizer(), loss=logits_loss(), metrics=list(metrics),
                      steps_per_execution=steps_per_execution)

    def trainer_fit(**kwargs: Any) -> Any:
        return trainer.fit(dataset, global_batch_size=global_batch_size, **kwargs)

    def keras_fit(**kwargs: Any) -> Any:
        return model.fit(dataset, **kwargs)

    sides = {"trainer": FitThroughput(trainer_fit, steps=steps, global_batch_size=global_batch_size),
             "keras_fit": FitThroughput(keras_fit, steps=steps, global_batch_size=global_batch_size)}
    for side in sides.values():
        side()
        side.overheads.clear()
    return sides


def fit_summary(samples: Samples, sides: Mapping[str, FitThroughput]) -> dict[str, Any]:
    """Medians of the "trainer" and "keras_fit" sides and their ratio (trainer / keras)."""
    trainer_rate = samples.median("trainer")
    keras_rate = samples.median("keras_fit")
    return {
        "trainer_examples_per_s": trainer_rate,
        "keras_fit_examples_per_s": keras_rate,
        "ratio": ratio(trainer_rate, keras_rate),
        "fit_overhead_s": {name: median(side.overheads) for name, side in sides.items()},
    }
