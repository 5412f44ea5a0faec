"""One ``Trainer.fit``, wired in order: data, compiled functions, backups, then the epochs.

The Trainer checks ``fit``'s arguments and picks its ``steps_per_execution``;
`run_fit` does the rest with the parts it is handed (the compiled functions, the
backups, the Trainer's options bundle), never the Trainer itself, and hands the epochs
one `tfdist.training.fit.one_epoch.FitRun`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import keras

from tfdist.training.backup.fit_backups import FitBackups
from tfdist.training.balance.balancer import balanced_start
from tfdist.training.fit import evaluation
from tfdist.training.fit.arguments import FitArguments
from tfdist.training.fit.one_epoch import EpochPlan, FitRun
from tfdist.training.fit.sources import fit_sources
from tfdist.training.fit.train_loop import fit_epochs
from tfdist.training.functions import StepFunctions
from tfdist.training.health.monitor import fit_health
from tfdist.training.options import TrainerOptions


def run_fit(
    functions: StepFunctions,
    backups: FitBackups,
    data: Any,
    validation_data: Any,
    args: FitArguments,
    options: TrainerOptions,
    steps_per_execution: int,
) -> keras.callbacks.History:
    """Trains ``functions.model`` as ``Trainer.fit`` says, its arguments already checked.

    Args:
        functions: The model's compiled functions on its runner.
        backups: The Trainer's backups for this fit (none without ``BackupOptions``).
        data: ``fit``'s ``x``, ``y`` and ``sample_weight``, packed by
            `tfdist.training.fit.keras_data.keras_data`.
        validation_data: As for ``Trainer.fit``.
        args: ``fit``'s other arguments, checked.
        options: The Trainer's options: its learning-rate scaling (resolved for this fit's
            batch), watchdog, straggler report and balanced batches.
        steps_per_execution: Micro-batches per call, resolved for this fit.

    Returns:
        The model's ``History``.
    """
    runner, model = functions.runner, functions.model
    health = fit_health(
        runner,
        watchdog=options.watchdog,
        stragglers=options.stragglers,
        callbacks=args.callbacks,
        has_backup=backups.options is not None,
    )
    with health:
        with health.section("startup", 0):
            source, steps, val_source = fit_sources(
                data, validation_data, args, runner=runner, model=model, build=functions.build
            )
            start = functions.prepare_fit(source, steps=steps, lr_scaling=options.lr_scaling)
            model.stop_training = False
            backup = backups.open()
            position = backups.restore(backup)  # every worker: the chief's position
            start = balanced_start(
                start, options.balance, runner, source, steps, args.callbacks, position
            )
        freq = backups.options.freq if backups.options else "epoch"
        # The loop sees only this fit's parts (`start` and `functions.logs`), never the Trainer.
        run = FitRun(
            plan=EpochPlan(steps, functions.accumulation_steps, steps_per_execution, freq),
            runner=runner,
            model=model,
            start=start,
            logs_fn=functions.logs,
            source=source,
            backup=backup,
            position=position,
            validate=_validation(functions, val_source, args, steps_per_execution),
            health=health,
        )
        # Local SGD: a partial round's sync before any on_train_end (every worker runs it).
        callbacks = [_EndFit(functions), *args.callbacks]
        with backups.during(backup):  # then waits for the last commit; removes after success
            fit_epochs(run, dataclasses.replace(args, callbacks=callbacks))
    return model.history


class _EndFit(keras.callbacks.Callback):
    """The first ``on_train_end``: `tfdist.training.updates.Updates.end_fit` (local SGD's
    sync of a partial round), so the other callbacks and the caller see one model."""

    def __init__(self, functions: StepFunctions) -> None:
        super().__init__()
        self.functions = functions

    def on_train_end(self, logs: dict | None = None) -> None:
        self.functions.updates.end_fit()


def _validation(
    functions: StepFunctions, val_source: Any, args: FitArguments, steps_per_execution: int
) -> Any:
    """The epoch loop's ``validate``, or None without validation data."""
    if val_source is None:
        return None

    def validate(epoch: int, callbacks: keras.callbacks.CallbackList) -> dict[str, float]:
        if not args.validates_after(epoch):
            return {}
        return evaluation.evaluate(
            functions,
            val_source,
            args.validation_steps,
            steps_per_execution=steps_per_execution,
            callbacks=callbacks,
        )

    return validate
