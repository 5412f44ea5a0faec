"""The training loop, the replica step, precision, backups and callbacks.

Names load on first use, so that importing one module of this package (e.g.
``tfdist.training.options``) does not import the whole Trainer.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Trainer", "BackupOptions", "ExchangeOptions", "LRScaling"]
_MODULES = {
    "Trainer": "tfdist.training.trainer",
    "BackupOptions": "tfdist.training.options",
    "ExchangeOptions": "tfdist.training.options",
    "LRScaling": "tfdist.training.options",
}


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module 'tfdist.training' has no attribute {name!r}")
    return getattr(importlib.import_module(_MODULES[name]), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
