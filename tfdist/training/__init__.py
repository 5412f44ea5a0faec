"""The training loop, the replica step, precision, backups and callbacks.

One job per module: ``trainer`` (``Trainer``: checks its arguments and wires
the parts), ``options`` (the option groups), ``build`` (model, optimizer and
metrics into the scope), ``placement`` (a model made outside the scope),
``functions`` (the compiled functions), ``sources`` (data arguments),
``fit_arguments`` (``fit``'s argument checks, ``steps_per_execution``),
``fit`` (one ``fit`` wired in order), ``loop`` (the epoch loop),
``evaluation`` (evaluate, predict), ``resume`` (which backup a fit uses),
``step`` (the replica step), ``gradients`` (its gradient helpers),
``exchange`` (the all-reduce), ``precision``, ``schedules``, ``preemption``
(SIGTERM), ``backup`` (the backup writer), ``backup_sync`` (workers agreeing on
the chief's backup), ``backup_files`` and ``callbacks``.

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
