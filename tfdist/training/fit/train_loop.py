"""The epochs of one ``Trainer.fit``: ``on_train_begin`` to ``on_train_end``, SIGTERM watched.

`fit_epochs` sets up the callbacks and the SIGTERM watcher; `train_epochs` runs
the epochs (an iterator per epoch, or one across them, validation, epoch-end backups), each
through `tfdist.training.fit.one_epoch.EpochLoop`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras

from tfdist.data.inputs import InputSource
from tfdist.data.release import release
from tfdist.strategies.base import LogsFn, Runner
from tfdist.training.backup.writer import Backup, Position
from tfdist.training.fit.chief_only import FitCallbackList, chief_writes_only, for_this_worker
from tfdist.training.fit.one_epoch import EpochLoop, EpochPlan, StartUpdates, Validate
from tfdist.training.fit.preemption import PreemptionWatcher
from tfdist.training.health.monitor import Health


def fit_epochs(
    plan: EpochPlan,
    *,
    runner: Runner,
    model: keras.Model,
    callbacks: Sequence[Any],
    verbose: int,
    start: StartUpdates,
    logs_fn: LogsFn,
    backup: Backup | None,
    position: Position | None,
    source: InputSource,
    epochs: int,
    initial_epoch: int,
    repeat: bool,
    validate: Validate | None,
    health: Health | None = None,
) -> None:
    """One ``fit``'s training from ``on_train_begin`` to ``on_train_end``, SIGTERM watched.

    Args:
        plan: How epochs are cut into executions.
        runner: The strategy's runner.
        model: The compiled model.
        callbacks: The user's Keras callbacks.
        verbose: 0 silent, 1 progress bar, 2 one line per epoch (chief only).
        start: Starts updates (see `StartUpdates`).
        logs_fn: The logs in cross-replica context.
        backup: Where backups go, or None.
        position: Where a restored backup stood, or None.
        source, epochs, initial_epoch, repeat, validate: As for `train_epochs`.
        health: The fit's watchdog and straggler report, or None.
    """
    with (
        chief_writes_only(callbacks, is_chief=runner.is_chief, task_label=runner.task_label),
        PreemptionWatcher(has_backup=backup is not None) as watcher,
    ):
        # Made inside chief_writes_only: set_model makes TensorBoard cache its
        # log paths, which must already be the redirected ones on non-chiefs.
        callback_list = FitCallbackList(
            for_this_worker(callbacks, is_chief=runner.is_chief),
            add_history=True,
            add_progbar=bool(verbose) and runner.is_chief,
            verbose=verbose,
            epochs=epochs,
            steps=plan.steps,
            model=model,
        )
        runner.expect_batch_logs(callback_list.reads_batch_logs)
        # SIGTERM: save and exit 75 with a backup, else stop and exit 143.
        loop = EpochLoop(
            plan,
            runner=runner,
            callbacks=callback_list,
            start=start,
            logs_fn=logs_fn,
            should_stop=lambda: model.stop_training,
            stop=lambda: setattr(model, "stop_training", True),
            backup=backup,
            watcher=watcher,
            updates=position.updates if position else 0,
            health=health,
        )
        train_epochs(
            loop,
            model=model,
            source=source,
            epochs=epochs,
            initial_epoch=initial_epoch,
            repeat=repeat,
            position=position,
            validate=validate,
        )


def train_epochs(
    loop: EpochLoop,
    *,
    model: keras.Model,
    source: InputSource,
    epochs: int,
    initial_epoch: int,
    repeat: bool,
    position: Position | None,
    validate: Validate | None = None,
) -> None:
    """Runs epochs ``initial_epoch..epochs-1`` with ``loop`` and its callbacks (train begin to end).

    Args:
        loop: The epoch loop, its callbacks and backup.
        model: The model (metrics reset per epoch, ``stop_training`` honoured).
        source: The training input.
        epochs: Epochs to reach.
        initial_epoch: The first epoch to run (a resumed position overrides it).
        repeat: One iterator over the repeated data across epochs (``steps_per_epoch``
            given, Keras's rule) instead of one pass per epoch.
        position: Where a restored backup stood, or None.
        validate: Returns an epoch's validation logs (un-prefixed; empty when
            that epoch does not validate), calling the callbacks' test hooks;
            None for no validation.
    """
    runner, callbacks = loop.runner, loop.callbacks
    if position is not None:
        initial_epoch = position.epoch
    persistent = None
    # A PyDataset's hooks run around each epoch when the epochs share one stream (Keras's).
    hooks = source.epoch_hooks if repeat else None
    if hooks is not None:
        hooks.per_epoch()
    with loop.section("epoch callbacks"):
        callbacks.on_train_begin()
    for epoch in range(initial_epoch, epochs):
        first_step = position.step if position is not None and epoch == position.epoch else 0
        if hooks is not None:
            hooks.epoch_begin()
        epoch_logs, persistent = _train_epoch(
            loop, model, source, epoch, first_step, initial_epoch, position, repeat, persistent
        )
        if hooks is not None:
            hooks.epoch_end()
        if validate is not None:  # with the test hooks, as Keras's fit calls evaluate
            with loop.section("evaluate"):
                logs = validate(epoch, callbacks)
            epoch_logs.update({f"val_{name}": v for name, v in logs.items()})
        with loop.section("epoch callbacks"):
            callbacks.on_epoch_end(epoch, epoch_logs)
        if loop.backup is not None:
            with loop.section("backup"):
                loop.backup.save(Position(epoch + 1, 0, loop.updates))
        # Every worker ends here: any worker's stop_training (set in on_epoch_end, say) stops all.
        with loop.section("vote"):
            stop = runner.agree(bool(model.stop_training))
        if stop:
            model.stop_training = True
            break
    if persistent is not None and runner.reads_training_input_here:
        release(persistent)  # the one stream of every epoch (see `_train_epoch`)
    persistent = None
    # As Keras's fit: with use_ema=True the model ends with the moving averages of its weights.
    if isinstance(model.optimizer, keras.optimizers.Optimizer):
        model.optimizer.finalize_variable_values(model.trainable_weights)
    loop.wait_for_backup()  # on_train_end sees the last backup committed (RayBackup reports it)
    with loop.section("epoch callbacks"):
        callbacks.on_train_end(loop.logs)


def _train_epoch(
    loop: EpochLoop,
    model: keras.Model,
    source: InputSource,
    epoch: int,
    first_step: int,
    initial_epoch: int,
    position: Position | None,
    repeat: bool,
    persistent: Any,
) -> tuple[dict[str, float], Any]:
    """One epoch's updates, from ``first_step``: its logs, and the persistent iterator."""
    runner = loop.runner
    # Resuming skips the batches already trained on inside tf.data, not by next() calls.
    with loop.section("input"):
        if not repeat:  # Keras's fit makes an unused iterator between epochs: so do we
            source.spare_iterator(epochs_before=epoch - initial_epoch)
        iterator, persistent = _epoch_iterator(
            runner, source, epoch, first_step, position, repeat, persistent, loop.plan.steps
        )
    with loop.section("metrics"):  # a collective on MultiWorkerMirrored
        model.reset_metrics()
    with loop.section("epoch callbacks"):
        loop.callbacks.on_epoch_begin(epoch)
    logs = loop.epoch(epoch, iterator, first_step=first_step)
    if not repeat and runner.reads_training_input_here:
        # Deleting it waits for tf.data's autotuning, seconds after a long epoch: another
        # thread does, once this one has returned (`tfdist.data.release`).
        release(iterator)
    return logs, persistent


def _epoch_iterator(
    runner: Runner,
    source: InputSource,
    epoch: int,
    first_step: int,
    position: Position | None,
    repeat: bool,
    persistent: Any,
    steps: int,
) -> tuple[Any, Any]:
    """The epoch's iterator and the persistent one (``repeat``), past the batches trained on."""
    if repeat:
        if persistent is None:
            # One repeated stream from epoch 0: skip every step trained on since.
            done = epoch * steps + first_step if position is not None else 0
            persistent = runner.make_iterator(runner.distribute(source.repeated().skipping(done)))
        iterator = persistent
    else:
        iterator = runner.make_iterator(
            runner.distribute(source.for_epoch(epoch).skipping(first_step))
        )
    return iterator, persistent
