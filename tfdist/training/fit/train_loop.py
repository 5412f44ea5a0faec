"""The epochs of one ``Trainer.fit``: ``on_train_begin`` to ``on_train_end``, SIGTERM watched.

`fit_epochs` sets up the callbacks and the SIGTERM watcher; `train_epochs` runs
the epochs (an iterator per epoch, or one across them, validation, epoch-end backups), each
through `tfdist.training.fit.one_epoch.EpochLoop`.
"""

from __future__ import annotations

from typing import Any

import keras

from tfdist.data.release import release
from tfdist.training.backup.writer import Position
from tfdist.training.fit.arguments import FitArguments
from tfdist.training.fit.chief_only import FitCallbackList, chief_writes_only, for_this_worker
from tfdist.training.fit.one_epoch import EpochLoop, FitRun, reset_metrics
from tfdist.training.fit.preemption import PreemptionWatcher


def fit_epochs(run: FitRun, args: FitArguments) -> None:
    """One ``fit``'s training from ``on_train_begin`` to ``on_train_end``, SIGTERM watched.

    Args:
        run: The fit's parts: plan, runner, model, ``start``, source, backup, ...
        args: ``fit``'s checked arguments (callbacks, verbose, epochs, ...).
    """
    runner, callbacks = run.runner, args.callbacks
    with (
        chief_writes_only(callbacks, is_chief=runner.is_chief, task_label=runner.task_label),
        PreemptionWatcher(has_backup=run.backup is not None) as watcher,
    ):
        # Made inside chief_writes_only: set_model makes TensorBoard cache its
        # log paths, which must already be the redirected ones on non-chiefs.
        callback_list = FitCallbackList(
            for_this_worker(callbacks, is_chief=runner.is_chief),
            add_history=True,
            add_progbar=bool(args.verbose) and runner.is_chief,
            verbose=args.verbose,
            epochs=args.epochs,
            steps=run.plan.steps,
            model=run.model,
        )
        runner.expect_batch_logs(callback_list.reads_batch_logs)
        # SIGTERM: save and exit 75 with a backup, else stop and exit 143.
        loop = EpochLoop(run, callback_list, watcher)
        # Keras's rule: with steps_per_epoch, one iterator over the repeated data across epochs.
        train_epochs(
            loop,
            epochs=args.epochs,
            initial_epoch=args.initial_epoch,
            repeat=bool(args.steps_per_epoch),
        )


def train_epochs(loop: EpochLoop, *, epochs: int, initial_epoch: int, repeat: bool) -> None:
    """Runs epochs ``initial_epoch..epochs-1`` with ``loop`` and its callbacks (train begin to end).

    The model, the source, the restored position and the validation are ``loop.run``'s (see
    `FitRun`): the model's metrics are reset per epoch and its ``stop_training`` honoured; a
    restored position overrides ``initial_epoch``.

    Args:
        loop: The epoch loop, its callbacks and backup.
        epochs: Epochs to reach.
        initial_epoch: The first epoch to run (a resumed position overrides it).
        repeat: One iterator over the repeated data across epochs (``steps_per_epoch``
            given, Keras's rule) instead of one pass per epoch.
    """
    runner, callbacks = loop.runner, loop.callbacks
    model, position, validate = loop.run.model, loop.run.position, loop.run.validate
    if position is not None:
        initial_epoch = position.epoch
    persistent = None
    # A PyDataset's hooks run around each epoch when the epochs share one stream (Keras's).
    hooks = loop.run.source.epoch_hooks if repeat else None
    if hooks is not None:
        hooks.per_epoch()
    with loop.section("epoch callbacks"):
        callbacks.on_train_begin()
    for epoch in range(initial_epoch, epochs):
        first_step = position.step if position is not None and epoch == position.epoch else 0
        if hooks is not None:
            hooks.epoch_begin()
        epoch_logs, persistent = _train_epoch(
            loop,
            epoch,
            first_step,
            epochs_before=epoch - initial_epoch,
            repeat=repeat,
            persistent=persistent,
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
        # Every worker ends here: any worker's stop_training (set in on_epoch_end, say) stops all,
        # and a SIGTERM during the validation stops the fit (else the last epoch's went unseen).
        if loop.stop_at_epoch_end(epoch):
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
    epoch: int,
    first_step: int,
    *,
    epochs_before: int,
    repeat: bool,
    persistent: Any,
) -> tuple[dict[str, float], Any]:
    """One epoch's updates, from ``first_step``: its logs, and the persistent iterator.

    ``epochs_before``: the epochs this fit ran before this one.
    """
    runner, source = loop.runner, loop.run.source
    # Resuming skips the batches already trained on inside tf.data, not by next() calls.
    with loop.section("input"):
        if not repeat:  # Keras's fit makes an unused iterator between epochs: so do we
            source.spare_iterator(epochs_before=epochs_before)
        iterator, persistent = _epoch_iterator(loop.run, epoch, first_step, repeat, persistent)
    with loop.section("metrics"):
        reset_metrics(runner, loop.run.model)
    with loop.section("epoch callbacks"):
        loop.callbacks.on_epoch_begin(epoch)
    logs = loop.epoch(epoch, iterator, first_step=first_step)
    if not repeat and runner.reads_training_input_here:
        # Deleting it waits for tf.data's autotuning, seconds after a long epoch: another
        # thread does, once this one has returned (`tfdist.data.release`).
        release(iterator)
    return logs, persistent


def _epoch_iterator(
    run: FitRun, epoch: int, first_step: int, repeat: bool, persistent: Any
) -> tuple[Any, Any]:
    """The epoch's iterator and the persistent one (``repeat``), past the batches trained on."""
    runner, source = run.runner, run.source
    if repeat:
        if persistent is None:
            # One repeated stream from epoch 0: skip every step trained on since.
            done = epoch * run.plan.steps + first_step if run.position is not None else 0
            persistent = runner.make_iterator(runner.distribute(source.repeated().skipping(done)))
        iterator = persistent
    else:
        iterator = runner.make_iterator(
            runner.distribute(source.for_epoch(epoch).skipping(first_step))
        )
    return iterator, persistent
