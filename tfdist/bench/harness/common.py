"""What every benchmark shares: the registry and the strategies.

A benchmark is a function ``(repeats, quick) -> dict`` registered under a
snake_case name. It lives in its own module under ``tfdist/bench/`` and is
listed in ``tfdist.bench.names.BENCHMARKS``::

    @common.register("my_bench")
    def my_bench(repeats: int, quick: bool) -> dict: ...

Strategies are created once per process by `init_strategies`, which the
runner calls before any other TensorFlow work (MirroredStrategy on the CPU needs
virtual devices, which exist only if they are configured before TF initialises).

The parameter-server strategy is different: creating it starts an in-process
loopback cluster and connects this process to it, after which TF names the
local devices ``/job:chief/...`` and the mirrored and one_device strategies
made before can no longer place anything ("/job:localhost/... unknown
device"). So it is created lazily, by the first ``strategy("parameter_server")``,
and a benchmark that uses it registers with ``connects_cluster=True``: the
runner runs such benchmarks after all the others.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import tensorflow as tf

from tfdist.config import StrategyName, invalid_argument

BenchmarkFn = Callable[[int, bool], dict[str, Any]]
PlotFn = Callable[[dict[str, Any], str], None]

# Replicas of the mirrored strategy the benchmarks use (virtual CPU devices).
MIRRORED_DEVICES = 2

# The in-process cluster of the parameter_server strategy.
PS_WORKERS = 2
PS_TASKS = 1
# Registry names (tfdist.config.StrategyName): the subset the benchmarks share.
LOCAL_KINDS: tuple[StrategyName, ...] = ("mirrored", "one_device")
CLUSTER_KIND: StrategyName = "parameter_server"

_REGISTRY: dict[str, BenchmarkFn] = {}
_CONNECTS_CLUSTER: set[str] = set()
_STRATEGIES: dict[str, tf.distribute.Strategy] = {}
_PLOTS: dict[str, PlotFn] = {}
_OPTIONS: dict[str, Any] = {}


def register(
    name: str, *, connects_cluster: bool = False, plot: PlotFn | None = None
) -> Callable[[BenchmarkFn], BenchmarkFn]:
    """Decorator: registers ``fn(repeats, quick) -> dict`` under ``name``.

    Args:
        name: The snake_case benchmark name.
        connects_cluster: The benchmark uses ``strategy("parameter_server")``,
            after which the local strategies stop working; it runs last.
        plot: ``plot(result, path)`` draws the benchmark's own PNG; the runner
            calls it with ``<output>.<name>.png``.
    """

    def wrap(fn: BenchmarkFn) -> BenchmarkFn:
        _REGISTRY[name] = fn
        if plot is not None:
            _PLOTS[name] = plot
        if connects_cluster:
            _CONNECTS_CLUSTER.add(name)
        else:
            _CONNECTS_CLUSTER.discard(name)
        return fn

    return wrap


def connects_cluster(name: str) -> bool:
    """Whether benchmark ``name`` connects this process to a cluster (so must run last)."""
    return name in _CONNECTS_CLUSTER


def plotter(name: str) -> PlotFn | None:
    """The PNG writer benchmark ``name`` registered, if any."""
    return _PLOTS.get(name)


def set_options(options: Mapping[str, Any] | None) -> None:
    """Sets the options benchmarks read with `options`.

    These are ``tfdist bench`` flags such as ``threads_per_worker``.
    """
    _OPTIONS.clear()
    _OPTIONS.update({k: v for k, v in (options or {}).items() if v is not None})


def options() -> dict[str, Any]:
    """The options set by the runner (a copy; unset ones are absent)."""
    return dict(_OPTIONS)


def registry() -> Mapping[str, BenchmarkFn]:
    """The registered benchmarks, name -> function (a copy)."""
    return dict(_REGISTRY)


def init_strategies() -> dict[str, tf.distribute.Strategy]:
    """Creates (once) the local strategies the benchmarks share. Call before other TF work.

    Returns:
        ``{"mirrored": <MirroredStrategy over 2 CPU devices>, "one_device": <on /cpu:0>}``,
        plus ``"parameter_server"`` once `strategy` has created it.

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
    """Returns the shared strategy ``kind``: "mirrored", "one_device" or "parameter_server".

    The first ``strategy("parameter_server")`` starts an in-process cluster of
    `PS_WORKERS` workers and `PS_TASKS` ps task
    (``tfdist.make_strategy("parameter_server", ...)``), after the local
    strategies exist, and caches it.

    Raises:
        ValueError: For an unknown ``kind``.
        RuntimeError: For a local strategy once the parameter-server strategy
            has connected this process to its cluster.
    """
    strategies = init_strategies()
    if kind == CLUSTER_KIND:
        if kind not in _STRATEGIES:
            from tfdist.strategies.factory import make_strategy

            # Deliberately after the local strategies (see the module docstring).
            _STRATEGIES[kind] = make_strategy(
                kind, num_workers=PS_WORKERS, num_ps=PS_TASKS, allow_late_connect=True
            )
        return _STRATEGIES[kind]
    if kind not in LOCAL_KINDS:
        raise invalid_argument("strategy", kind, sorted([*LOCAL_KINDS, CLUSTER_KIND]))
    if CLUSTER_KIND in _STRATEGIES:
        raise RuntimeError(
            f"The bench's {kind!r} strategy no longer works: the parameter_server strategy has "
            "connected this process to its in-process cluster, so its local devices are now "
            f"/job:chief/... . Run benchmarks that use {kind!r} first (runner.run orders them so)."
        )
    return strategies[kind]
