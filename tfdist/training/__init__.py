"""The Trainer and its parts: one package per concern, each with a map in its ``__init__``.

Start at ``trainer`` (``Trainer``: checks its arguments and wires the parts).

- ``trainer``: ``Trainer``, the one fit/evaluate/predict loop for every strategy.
- ``options``: the Trainer's option groups, small frozen dataclasses checked when made.
- ``functions``: the compiled functions of one model on one runner, built once and cached.
- ``updates``: the one place that chooses and combines the plain, sharded and pipeline updates.
- ``step/``: what one update computes: the replica step, gradients, the all-reduce, losses.
- ``build/``: what goes into the strategy scope: model, optimizer, metrics, precision, LR.
- ``fit/``: when things happen in one fit: arguments, data, epochs, callbacks, evaluation.
- ``zero/``: sharded optimizer state and gradients (ZeRO-1/2).
- ``pipeline/``: pipeline stages (model parallelism) and the hybrid.
- ``balance/``: batch shares by worker speed.
- ``local_sgd/``: local SGD and DiLoCo: replicas train on their own and sync every H updates.
- ``backup/``: step-exact backups and resuming.
- ``health/``: the watchdog and the straggler report.

Names load on first use, so that importing one module of this package (e.g.
``tfdist.training.options``) does not import the whole Trainer.
"""

from __future__ import annotations

from tfdist._lazy import lazy_attributes

__all__ = ["Trainer", "BackupOptions", "ExchangeOptions", "LRScaling"]
_MODULES = {
    "Trainer": "tfdist.training.trainer:Trainer",
    "BackupOptions": "tfdist.training.options:BackupOptions",
    "ExchangeOptions": "tfdist.training.options:ExchangeOptions",
    "LRScaling": "tfdist.training.options:LRScaling",
}

__getattr__, __dir__ = lazy_attributes(globals(), _MODULES)
