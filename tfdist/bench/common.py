"""What every benchmark shares: the registry and the strategies.

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

from typing import Any, Callable, Mapping

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
    """The registered benchmarks, name -> function (a copy)."""
    return dict(_REGISTRY)


def init_strategies() -> dict[str, tf.distribute.Strategy]:
    """Creates (once) the strategies the benchmarks share. Call before other TF work.

    Returns:
        ``{"mirrored": <MirroredStrategy over 2 CPU devices>, "one_device": <on /cpu:0>}``.

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
