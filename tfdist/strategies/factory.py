"""``make_strategy`` and ``runner_for``: strategies by name, and the runner for a strategy.

The kinds come from the leaf registry (``tfdist/strategies/registry.py``); each
lives in its own module, imported only when that kind is built or matched.
"""

from __future__ import annotations

import inspect
from typing import Any

import tensorflow as tf

from tfdist._compat.tf_internals.runtime import is_default_strategy
from tfdist.config import StrategyName, invalid_argument
from tfdist.strategies import registry


def available() -> tuple[str, ...]:
    """The names ``make_strategy`` accepts, sorted."""
    return registry.names()


def auto_kind() -> str:
    """The kind ``make_strategy("auto")`` builds in this environment.

    ``multi_worker`` (or ``parameter_server`` when the cluster has ``ps``
    tasks) if TF_CONFIG or Slurm describes a cluster, else ``mirrored``.
    """
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

    Example:
        ```python
        strategy = tfdist.make_strategy("mirrored", num_devices=2)
        with strategy.scope():
            ...
        ```

    Args:
        kind: One of ``available()``. ``auto`` picks ``multi_worker`` (or
            ``parameter_server`` when the cluster has ``ps`` tasks) if TF_CONFIG
            or Slurm describes a cluster, else ``mirrored`` over local devices.
        **options: Options of that strategy's builder, e.g. ``num_devices`` for
            mirrored, ``communication`` and ``stage_devices`` (pipeline stages in each
            worker) for multi_worker.

    Returns:
        A real ``tf.distribute.Strategy``; ``with strategy.scope():`` works.

    Raises:
        ValueError: For an unknown kind, an option the kind does not take, or
            a bad option value / cluster description.
        ImportError: If the kind's module fails to import (e.g. a missing dependency).
    """
    if kind == registry.AUTO:
        kind = auto_kind()
    entry = registry.get(kind)
    if entry is None:
        raise invalid_argument("strategy", kind, available())
    params = inspect.signature(entry.build).parameters
    for key in options:
        if key not in params:
            raise invalid_argument(
                key,
                options[key],
                f"an option of strategy {kind!r}: " + (", ".join(params) or "it takes none"),
            )
    return entry.build(**options)


def runner_for(strategy: tf.distribute.Strategy | None) -> Any:
    """Returns the runner that executes steps on ``strategy``.

    Args:
        strategy: Any strategy ``make_strategy`` can build, or ``None`` for the
            current (default) strategy.

    Raises:
        ValueError: If no registered kind matches the strategy.
        ImportError: If a strategy module fails to import.
    """
    if isinstance(strategy, str):
        raise invalid_argument(
            "strategy",
            strategy,
            "a tf.distribute.Strategy object",
            note=f"Build one with tfdist.make_strategy({strategy!r}).",
        )
    strategy = strategy or tf.distribute.get_strategy()
    for entry in registry.entries():
        if entry.matches(strategy):
            return entry.runner(strategy)
    if is_default_strategy(strategy):
        # Outside any scope: one replica, run synchronously like one_device.
        from tfdist.strategies.sync import SyncRunner

        return SyncRunner(strategy)
    kinds = ", ".join(sorted(registry.MODULES))
    raise invalid_argument(
        "strategy", type(strategy).__name__, "a strategy of one of the registered kinds: " + kinds
    )
