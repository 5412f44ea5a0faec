"""``make_strategy`` and the strategy registry.

Each strategy module registers a builder (returns a real
``tf.distribute.Strategy``) and a runner class under a snake_case name::

    @register("mirrored", runner=SyncRunner, matches=lambda s: ...)
    def build(**options) -> tf.distribute.Strategy: ...
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Literal

import tensorflow as tf

from tfdist.config import invalid_argument

StrategyName = Literal["auto", "one_device", "mirrored", "multi_worker", "parameter_server"]


@dataclasses.dataclass(frozen=True)
class _Entry:
    name: str
    build: Callable[..., tf.distribute.Strategy]
    runner: Callable[[tf.distribute.Strategy], Any]
    matches: Callable[[tf.distribute.Strategy], bool]


_REGISTRY: dict[str, _Entry] = {}


def register(name: str, *, runner: Callable[[tf.distribute.Strategy], Any],
             matches: Callable[[tf.distribute.Strategy], bool]):
    """Decorator: registers ``build(**options)`` under ``name``.

    Args:
        name: The snake_case registry key users pass to ``make_strategy``.
        runner: Builds the runner that executes steps on such a strategy.
        matches: Tells whether an existing strategy object is of this kind
            (used for strategies the user built without ``make_strategy``).
    """

    def wrap(build):
        _REGISTRY[name] = _Entry(name, build, runner, matches)
        return build

    return wrap


def available() -> tuple[str, ...]:
    """The names ``make_strategy`` accepts, sorted."""
    _load_builtins()
    return tuple(sorted(["auto", *_REGISTRY]))


def _load_builtins() -> None:
    # Importing the modules runs their @register decorators.
    from tfdist.strategies import mirrored, multi_worker, one_device  # noqa: F401
    try:
        from tfdist.strategies import parameter_server  # noqa: F401
    except ImportError:
        pass


def _auto_kind() -> str:
    from tfdist import cluster

    info = cluster.from_environment()
    if info is None:
        return "mirrored"
    if "ps" in info.cluster:
        return "parameter_server"
    return "multi_worker"


def make_strategy(kind: StrategyName | str = "auto", **options: Any) -> tf.distribute.Strategy:
    """Creates a ``tf.distribute.Strategy`` by name.

    Call it at the start of the program, before other TensorFlow work: virtual
    CPU devices and collective ops must be configured before TF initialises.

    Example::

        strategy = tfdist.make_strategy("mirrored", num_devices=2)
        with strategy.scope():
            ...

    Args:
        kind: One of ``available()``. ``auto`` picks ``multi_worker`` (or
            ``parameter_server`` when the cluster has ``ps`` tasks) if TF_CONFIG
            or Slurm describes a cluster, else ``mirrored`` over local devices.
        **options: Options of that strategy's builder, e.g. ``num_devices`` for
            mirrored, ``communication`` for multi_worker.

    Returns:
        A real ``tf.distribute.Strategy``; ``with strategy.scope():`` works.

    Raises:
        ValueError: For an unknown kind, an option the kind does not take, or
            a bad option value / cluster description.
    """
    _load_builtins()
    if kind == "auto":
        kind = _auto_kind()
    entry = _REGISTRY.get(kind)
    if entry is None:
        raise invalid_argument("strategy", kind, available())
    params = inspect.signature(entry.build).parameters
    for key in options:
        if key not in params:
            raise invalid_argument(
                key, options[key], f"an option of strategy {kind!r}: "
                + (", ".join(params) or "it takes none"))
    return entry.build(**options)


def runner_for(strategy: tf.distribute.Strategy | None) -> Any:
    """Returns the runner that executes steps on ``strategy``.

    Args:
        strategy: Any strategy ``make_strategy`` can build, or ``None`` for the
            current (default) strategy.

    Raises:
        ValueError: If no registered kind matches the strategy.
    """
    _load_builtins()
    if isinstance(strategy, str):
        raise invalid_argument("strategy", strategy, "a tf.distribute.Strategy object",
                               note=f"Build one with tfdist.make_strategy({strategy!r}).")
    strategy = strategy or tf.distribute.get_strategy()
    for entry in _REGISTRY.values():
        if entry.matches(strategy):
            return entry.runner(strategy)
    from tfdist.strategies.sync import SyncRunner

    if type(strategy).__name__ == "_DefaultDistributionStrategy":
        return SyncRunner(strategy)
    raise invalid_argument("strategy", type(strategy).__name__,
                           "a strategy of one of the registered kinds: " + ", ".join(sorted(_REGISTRY)))
