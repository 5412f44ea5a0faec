"""tfdist: one Keras 3 training loop for every tf.distribute strategy.

    import tfdist
    strategy = tfdist.make_strategy("mirrored", num_devices=2)
    trainer = tfdist.Trainer(
        lambda: tfdist.models.get("cnn"), strategy=strategy, loss=..., metrics=["accuracy"]
    )
    trainer.fit(tfdist.data.load("digits"), epochs=5, global_batch_size=128)

``import tfdist`` is lazy: it imports no TensorFlow, so that ``tfdist launch``
(which only supervises processes) stays small. TensorFlow, Keras and the
compatibility shims of ``tfdist._compat`` load when a TF-using name is first
touched (``tfdist.Trainer``, ``tfdist.make_strategy``, ``tfdist.callbacks``,
``tfdist.data``, ``tfdist.models``), or when one of those modules is imported
directly (``from tfdist.training.trainer import Trainer``). If Keras is already
imported, ``import tfdist`` applies the shims at once, so that plain
``model.fit`` under ``tf.distribute`` strategies works after ``import tensorflow; import tfdist``.

The package's parts, from the bottom up (ARCHITECTURE.md draws them):

- ``_lazy``, ``config``, ``logs``, ``quiet``: lazy names; validated options and errors; logs
  as floats; TF's start-up kept quiet. ``__main__``: ``python -m tfdist``.
- ``_compat/``: the Keras and TF internals tfdist uses, and its shims.
- ``cluster/``, ``data/``, ``models/``: cluster environments, inputs, Keras model builders.
- ``strategies/``: ``make_strategy`` and the runners.
- ``training/``: the ``Trainer`` and its parts. ``callbacks``: ``BackupAndRestore`` for
  plain ``model.fit``.
- ``launch/``: processes: ``tfdist launch``, notebooks, Slurm, Kubernetes, Ray.
- ``bench/``: side-by-side measurements. ``cli/``: the ``tfdist`` command.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
from typing import Any

from tfdist._lazy import lazy_attributes

__version__ = "0.1.0"
__all__ = [
    "Trainer",
    "BackupOptions",
    "ExchangeOptions",
    "StragglerOptions",
    "WatchdogOptions",
    "LRScaling",
    "PipelineOptions",
    "BalanceOptions",
    "LocalSGDOptions",
    "make_strategy",
    "stage_tasks",
    "quiet_tensorflow",
    "callbacks",
    "data",
    "launch",
    "models",
    "__version__",
]

# Subpackages and modules that use TensorFlow: the shims go in before any of them loads.
_TF_MODULES = (
    "tfdist.training",
    "tfdist.strategies",
    "tfdist.data",
    "tfdist.models",
    "tfdist.callbacks",
    "tfdist.bench",
    "tfdist.launch.train",
)
#: Of those, the pure-Python ones the CLI reads before TF loads: the bench's registry of names.
_NO_TF_MODULES = ("tfdist.bench", "tfdist.bench.names")
_ATTRIBUTES = {
    "Trainer": "tfdist.training.trainer:Trainer",
    "BackupOptions": "tfdist.training.options:BackupOptions",
    "ExchangeOptions": "tfdist.training.options:ExchangeOptions",
    "StragglerOptions": "tfdist.training.health.stragglers:StragglerOptions",
    "WatchdogOptions": "tfdist.training.health.watchdog:WatchdogOptions",
    "LRScaling": "tfdist.training.options:LRScaling",
    "PipelineOptions": "tfdist.training.pipeline.options:PipelineOptions",
    "BalanceOptions": "tfdist.training.balance.balancer:BalanceOptions",
    "LocalSGDOptions": "tfdist.training.local_sgd.options:LocalSGDOptions",
    "make_strategy": "tfdist.strategies.factory:make_strategy",
    "stage_tasks": "tfdist.strategies.stage_tasks:stage_tasks",
    "quiet_tensorflow": "tfdist.quiet:quiet_tensorflow",
    "callbacks": "tfdist.callbacks",
    "data": "tfdist.data",
    "models": "tfdist.models",
    "launch": "tfdist.launch",
}
_shims_applied = False


def _apply_shims() -> None:
    global _shims_applied
    if not _shims_applied:
        _shims_applied = True  # Set first: _compat's own imports must not come back here.
        try:
            from tfdist import _compat

            _compat.apply()
        except BaseException:
            _shims_applied = False
            raise


class _ShimsFirst(importlib.abc.MetaPathFinder):
    """Applies the compat shims just before the first TF-using tfdist module is imported.

    It finds nothing itself (returns None), so the normal finders import the module.
    """

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if (
            not _shims_applied
            and fullname not in _NO_TF_MODULES
            and any(fullname == m or fullname.startswith(m + ".") for m in _TF_MODULES)
        ):
            _apply_shims()
        return None


sys.meta_path.insert(0, _ShimsFirst())
# Keras already loaded (``import tensorflow`` loads it; Ray's TensorFlow quickstart imports it
# first): plain ``model.fit`` under a tf.distribute strategy needs the shims, and importing them
# costs nothing more now.
if "keras" in sys.modules:
    _apply_shims()


__getattr__, __dir__ = lazy_attributes(globals(), _ATTRIBUTES)
