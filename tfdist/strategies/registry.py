"""The strategy registry: each kind's name -> the module that builds it, loaded on first use.

A leaf: it imports no strategy module, and no strategy module imports it, so
there are no import circles, and a strategy module that fails to import raises
its ``ImportError`` where the kind is asked for (it does not vanish from the choices).

The names are `tfdist.config.STRATEGY_NAMES`. Every kind but ``auto``
lives in one module named like it, ``tfdist/strategies/<name>.py``, which defines:

* ``build(**options) -> tf.distribute.Strategy``: its options are the builder's
  keyword arguments, which ``make_strategy`` checks by name;
* ``RUNNER``: the runner class (``tfdist.strategies.base.Runner``) for its strategies;
* ``matches(strategy) -> bool``: whether a strategy built by anyone is of this kind.

To add a kind: write ``tfdist/strategies/<name>.py`` and add the name to
``tfdist.config.StrategyName``.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

from tfdist.config import STRATEGY_NAMES

#: Chooses one of the other kinds from the environment (see ``factory.auto_kind``).
AUTO = "auto"

#: Kind -> the module that defines its ``build``, ``RUNNER`` and ``matches``.
MODULES: dict[str, str] = {
    name: f"tfdist.strategies.{name}" for name in STRATEGY_NAMES if name != AUTO
}


@dataclasses.dataclass(frozen=True)
class Entry:
    """One registered kind, loaded from its module."""

    name: str
    build: Callable[..., Any]
    runner: Callable[[Any], Any]
    matches: Callable[[Any], bool]


def names() -> tuple[str, ...]:
    """Every name ``make_strategy`` accepts, ``auto`` included, sorted."""
    return tuple(sorted([AUTO, *MODULES]))


def get(name: str) -> Entry | None:
    """The entry of kind ``name`` (importing its module), or None for an unknown name.

    Raises:
        ImportError: If the kind's module fails to import: surfaced as is, so a
            broken strategy module is never mistaken for an unknown name.
    """
    if name not in MODULES:
        return None
    module = importlib.import_module(MODULES[name])
    return Entry(name, module.build, module.RUNNER, module.matches)


def entries() -> list[Entry]:
    """Every kind's entry (imports every strategy module), in registry order."""
    return [get(name) for name in MODULES]
