"""The shim machinery: one ``Shim`` record per workaround, applied from a table.

A shim is a probe of upstream behaviour plus the patches that work around it.
`apply_table` applies a shim only where its probe finds the behaviour,
saves what each patch replaced (see `original`), and is idempotent.

This module imports nothing from Keras or TensorFlow itself: patch targets are
named by ``"module:Class"`` strings and resolved only when a shim is applied.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

logger = logging.getLogger(__name__)

#: Comma-separated shim names to skip, e.g. to check whether upstream still needs one.
DISABLE_ENV = "TFDIST_DISABLE_COMPAT"


@dataclasses.dataclass(frozen=True)
class Patch:
    """Replaces ``attribute`` of ``target`` with ``make(the_original)``.

    Attributes:
        target: ``"module"`` or ``"module:Class"``, imported when applied.
        attribute: The function or method to replace.
        make: Builds the replacement from the original.
    """

    target: str
    attribute: str
    make: Callable[[Any], Any]

    def owner(self) -> Any:
        module, _, qualname = self.target.partition(":")
        owner = importlib.import_module(module)
        for part in filter(None, qualname.split(".")):
            owner = getattr(owner, part)
        return owner


@dataclasses.dataclass(frozen=True)
class Shim:
    """One workaround: applied only while ``probe()`` finds the upstream behaviour it fixes.

    Attributes:
        name: What ``TFDIST_DISABLE_COMPAT`` and `original` call it.
        reason: One line: the upstream behaviour it works around.
        probe: True while upstream still behaves that way (cheap: no tensors, no cluster).
        patches: What it replaces; ``original(name)`` returns the first one's original.
    """

    name: str
    reason: str
    probe: Callable[[], bool]
    patches: tuple[Patch, ...]


# name -> the originals its patches replaced, in patch order; present iff the shim is in force.
_ORIGINALS: dict[str, tuple[Any, ...]] = {}


def disabled() -> set[str]:
    """Shim names skipped through the ``TFDIST_DISABLE_COMPAT`` environment variable."""
    return {s.strip() for s in os.environ.get(DISABLE_ENV, "").split(",") if s.strip()}


def original(name: str) -> Any:
    """The upstream function shim ``name`` replaced (its first patch), or None if not in force."""
    saved = _ORIGINALS.get(name)
    return saved[0] if saved else None


def in_force(name: str) -> bool:
    """Whether shim ``name`` has been applied in this process."""
    return name in _ORIGINALS


def apply_table(shims: Sequence[Shim]) -> list[str]:
    """Applies each shim that is not disabled and whose probe finds its behaviour. Idempotent.

    A shim already in force is not probed again: its probe would now look at
    the patched function (probes fall back to `original` for that).

    Returns:
        The names of these shims in force, in table order.
    """
    skipped = disabled()
    applied = []
    for shim in shims:
        if shim.name in skipped or not (in_force(shim.name) or shim.probe()):
            continue
        if not in_force(shim.name):
            saved = []
            for patch in shim.patches:
                owner = patch.owner()
                saved.append(getattr(owner, patch.attribute))
                setattr(owner, patch.attribute, patch.make(saved[-1]))
            _ORIGINALS[shim.name] = tuple(saved)
            logger.debug("Applied compat shim %s: %s", shim.name, shim.reason)
        applied.append(shim.name)
    return applied
