"""Starting processes: ``tfdist launch``, ``notebook_launcher``, ``ray_launcher`` and cluster manifests.

Importing this package imports no TensorFlow (the launcher only supervises
processes) and no Ray: ``ray_launcher``, ``ray_fit`` and ``RayBackup`` load
:mod:`tfdist.launch.ray_engine` / :mod:`tfdist.launch.ray_backup` when first touched.
"""
from __future__ import annotations

import importlib
from typing import Any

from tfdist.launch.notebook import notebook_launcher

__all__ = ["notebook_launcher", "ray_launcher", "ray_fit", "RayBackup"]
_LAZY = {"ray_launcher": "tfdist.launch.ray_engine", "ray_fit": "tfdist.launch.ray_engine",
         "RayBackup": "tfdist.launch.ray_backup"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'tfdist.launch' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
