"""The epoch loop of ``Trainer.fit``: epochs, executions, callbacks, step-level backups, SIGTERM.

:func:`train_epochs` runs the epochs (an iterator per epoch, validation,
epoch-end backups); :class:`EpochLoop` runs one epoch's executions. It starts
updates through one callable, ``start(micro_batches, iterator, num_updates)``,
as Orbit's Controller calls only ``trainer.train(num_steps)``: it knows
nothing of the Trainer. It hands each execution's logs to the callbacks in
order (up to ``runner.max_in_flight`` executions may run ahead, for parameter
servers), takes step-level backups, and acts on SIGTERM at update boundaries:
with a backup it saves and exits 75 for a restart; without one every worker
stops at the same update and exits 143 (128 + SIGTERM). ``model.stop_training``
is voted on the same way, so that one worker's stop stops all at the same update.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import keras

from tfdist.config import PREEMPTED_EXIT_CODE, TERMINATED_EXIT_CODE
from tfdist.data.inputs import InputSource
from tfdist.strategies.base import STEPS_RUN_KEY, LogsFn, Runner
from tfdist.training.backup import Backup, Position
from tfdist.training.callbacks import FitCallbackList, chief_writes_only, for_this_worker
from tfdist.training.health import Health
from tfdist.training.preemption import PreemptionWatcher

logger = logging.getLogger(__name__)

#: ``start(micro_batches, iterator, num_updates)``: starts ``num_updates`` optimizer updates of
#: ``micro_batches`` micro-batches each and returns the runner's logs handle.
StartUpdates = Callable[[int, Any, int], Any]
#: ``validate(epoch, callbacks)``: evaluates after ``epoch`` (or returns {} when that epoch does
#: not validate), calling ``callbacks``' test hooks, and returns the logs.
Validate = Callable[[int, keras.callbacks.CallbackList], dict[str, float]]


@dataclasses.dataclass(frozen=True)
class EpochPlan:
    """How one ``fit`` cuts its epochs into executions; the same on every worker.

    Attributes:
        steps: Micro-batches per epoch; None: until the data is exhausted (one per update).
        accumulation_steps: Micro-batches per optimizer update (``k``).
        steps_per_execution: Micro-batches per call, rounded down to whole
            updates (at least one).
        backup_freq: ``"epoch"`` or updates between step-level backups.
    """

    steps: int | None
    accumulation_steps: int
    steps_per_execution: int
    backup_freq: int | str = "epoch"


class EpochLoop:
    """One fit call's epochs of executions: logs delivery, step-level backups, preemption.

    Args:
        plan: How an epoch is cut into executions.
        runner: Fetches logs, joins scheduled work and votes across workers.
        callbacks: The fit's callbacks, batch hooks called per execution.
        start: Starts updates (see :data:`StartUpdates`).
        logs_fn: The logs in cross-replica context, for ``runner.final_logs``.
        should_stop: True once a callback asked to stop (``model.stop_training``).
        stop: Makes ``should_stop`` true (another worker's callback asked to stop).
        backup: Where step-level backups go, or None.
        watcher: The SIGTERM watcher, or None.
        updates: Optimizer updates already attempted (over all runs, when resuming).
        health: The fit's watchdog and straggler report (sections are marked), or None.
    """

    def __init__(
        self,
        plan: EpochPlan,
        *,
        runner: Runner,
        callbacks: keras.callbacks.CallbackList,
        start: StartUpdates,
        logs_fn: LogsFn,
        should_stop: Callable[[], bool],
        stop: Callable[[], None] = lambda: None,
        backup: Backup | None = None,
        watcher: PreemptionWatcher | None = None,
        updates: int = 0,
        health: Health | None = None,
    ) -> None:
        self.health = health
        self.plan = plan
        self.runner = runner
        self.callbacks = callbacks
        self.start = start
        self.logs_fn = logs_fn
        self.should_stop = should_stop
        self.stop = stop
        self.backup = backup
        self.watcher = watcher
        self.updates = updates  # optimizer updates attempted, over all runs
        self.logs: Mapping[str, float] = {}  # the last call's (may be computed when first read)
        # (batch, logs handle) of executions started but not fetched yet
        self._pending: collections.deque = collections.deque()

    def section(self, name: str) -> contextlib.AbstractContextManager:
        """Marks a section of the fit for the watchdog (see :mod:`tfdist.training.health`)."""
        if self.health is None:
            return contextlib.nullcontext()
        return self.health.section(name, self.updates)

    def _deliver(self, limit: int) -> None:
        while len(self._pending) > limit:
            batch, handle = self._pending.popleft()
            with self.section("update"):
                self.logs = self.runner.fetch(handle)
            with self.section("callbacks"):
                self.callbacks.on_train_batch_end(batch, self.logs)

    def _call(
        self, micro_batches: int, iterator: Any, num_updates: int, first_batch: int, last_batch: int
    ) -> None:
        with self.section("callbacks"):
            self.callbacks.on_train_batch_begin(first_batch)
        with self.section("update"):
            handle = self.start(micro_batches, iterator, num_updates)
        self._pending.append((last_batch, handle))
        self._deliver(self.runner.max_in_flight)

    def _save(self, epoch: int, step: int) -> None:
        # Every scheduled update must have run (and its logs reached the callbacks) before the
        # variables are saved with a position that says they did.
        self._deliver(0)
        with self.section("update"):
            self.runner.join()
        with self.section("backup"):
            self.backup.save(Position(epoch, step, self.updates))

    def wait_for_backup(self) -> None:
        """Waits for the commit of the backup in flight, if any (raising its failure)."""
        if self.backup is not None:
            with self.section("backup"):
                self.backup.wait()

    def _stop_for_sigterm(self, epoch: int, step: int) -> None:
        """Every worker gets here at the same update: ``agree`` voted on the SIGTERM."""
        if self.backup is not None:
            self._save(epoch, step)
            self.wait_for_backup()  # committed before the exit: the restart resumes from it
            logger.warning(
                "Saved a backup at epoch %d, micro-batch %d after %s; exiting with "
                "code %d so the launcher restarts this run.",
                epoch + 1,
                step,
                "SIGTERM" if self.watcher is not None and self.watcher.requested else "a stop",
                PREEMPTED_EXIT_CODE,
            )
            raise SystemExit(PREEMPTED_EXIT_CODE)
        self._deliver(0)
        self.runner.join()
        logger.warning(
            "Stopped at epoch %d, micro-batch %d (%d updates) after SIGTERM; no "
            "backup_dir, so nothing was saved. Exiting with code %d.",
            epoch + 1,
            step,
            self.updates,
            TERMINATED_EXIT_CODE,
        )
        raise SystemExit(TERMINATED_EXIT_CODE)

    def _vote(self, epoch: int, step: int) -> bool:
        """One collective on every worker: True if any asked to stop; then all stop here.

        One vote covers a SIGTERM and ``model.stop_training``, so that a
        callback that stops training on one worker only (its own clock, say)
        stops every worker; a second vote, taken only once the first said
        stop, tells a SIGTERM from a callback's stop.
        """
        requested = self.watcher is not None and self.watcher.requested
        requested = requested or (self.health is not None and self.health.stop_requested)
        with self.section("vote"):
            if not self.runner.agree(requested or self.should_stop()):
                return False
            restart = self.runner.agree(requested)
        if restart:
            self._stop_for_sigterm(epoch, step)
        self.stop()
        return True

    def epoch(self, epoch: int, iterator: Any, *, first_step: int = 0) -> dict[str, float]:
        """Trains one epoch from micro-batch ``first_step`` and returns its logs."""
        if self.plan.steps is None:
            return self._epoch_until_exhausted(epoch, iterator, first_step)
        k, steps, freq = self.plan.accumulation_steps, self.plan.steps, self.plan.backup_freq
        full_updates, last_window = divmod(steps, k)
        per_call = max(self.plan.steps_per_execution // k, 1)
        backing_up = isinstance(freq, int) and self.backup is not None
        done = first_step // k
        # Keras's fit looks at stop_training after each call, so a stop asked for in
        # on_epoch_begin still trains one batch (steps_per_execution=1, Keras's default).
        stopping, calls = self._vote(epoch, first_step), 0
        while done < full_updates and not (stopping and calls):
            n = 1 if stopping else min(per_call, full_updates - done)
            if backing_up:
                n = min(n, freq - self.updates % freq)  # a call ends where a backup is due
            self._call(k, iterator, n, done * k, (done + n) * k - 1)
            done += n
            before, self.updates = self.updates, self.updates + n
            crossed = isinstance(freq, int) and before // freq != self.updates // freq
            if backing_up and crossed and done * k < steps:  # the epoch end saves anyway
                self._save(epoch, done * k)
            calls += 1
            stopping = self._vote(epoch, done * k)
        if last_window and not (stopping and calls):
            # The epoch's last `last_window` micro-batches make one smaller
            # update, still a true mean over its examples.
            self._call(last_window, iterator, 1, done * k, steps - 1)
            self.updates += 1
        self._deliver(0)
        with self.section("update"):
            self.logs = self.runner.final_logs(self.logs_fn, self.logs)
        return dict(self.logs)

    def _epoch_until_exhausted(
        self, epoch: int, iterator: Any, first_step: int
    ) -> dict[str, float]:
        """One epoch of unknown length: calls until one runs short (the data ran out), as
        Keras's fit runs such an epoch until its iterator is exhausted. One micro-batch per
        update; every worker learns the end in the same call (``until_exhausted``)."""
        per_call, freq = max(self.plan.steps_per_execution, 1), self.plan.backup_freq
        backing_up = isinstance(freq, int) and self.backup is not None
        done, calls = first_step, 0
        stopping = self._vote(epoch, done)
        while not (stopping and calls):
            n = 1 if stopping else per_call
            if backing_up:
                n = min(n, freq - self.updates % freq)  # a call ends where a backup is due
            with self.section("callbacks"):
                self.callbacks.on_train_batch_begin(done)
            with self.section("update"):
                logs = dict(self.runner.fetch(self.start(1, iterator, n)))
            ran = int(logs.pop(STEPS_RUN_KEY))
            before, self.updates, done, calls = (
                self.updates,
                self.updates + ran,
                done + ran,
                calls + 1,
            )
            if ran:
                self.logs = logs
                with self.section("callbacks"):
                    self.callbacks.on_train_batch_end(done - 1, logs)
            if ran < n:
                break  # the data is exhausted, on every worker at once
            if backing_up and before // freq != self.updates // freq:
                self._save(epoch, done)
            stopping = self._vote(epoch, done)
        with self.section("update"):
            self.logs = self.runner.final_logs(self.logs_fn, self.logs)
        return dict(self.logs)


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
        start: Starts updates (see :data:`StartUpdates`).
        logs_fn: The logs in cross-replica context.
        backup: Where backups go, or None.
        position: Where a restored backup stood, or None.
        source, epochs, initial_epoch, repeat, validate: As for :func:`train_epochs`.
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
    runner, callbacks, steps = loop.runner, loop.callbacks, loop.plan.steps
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
        # Resuming skips the batches already trained on inside tf.data, not by next() calls.
        with loop.section("input"):
            iterator, persistent = _epoch_iterator(
                runner, source, epoch, first_step, position, repeat, persistent, steps
            )
        with loop.section("metrics"):  # a collective on MultiWorkerMirrored
            model.reset_metrics()
        with loop.section("epoch callbacks"):
            callbacks.on_epoch_begin(epoch)
        epoch_logs = loop.epoch(epoch, iterator, first_step=first_step)
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
    # As Keras's fit: with use_ema=True the model ends with the moving averages of its weights.
    if isinstance(model.optimizer, keras.optimizers.Optimizer):
        model.optimizer.finalize_variable_values(model.trainable_weights)
    loop.wait_for_backup()  # on_train_end sees the last backup committed (RayBackup reports it)
    with loop.section("epoch callbacks"):
        callbacks.on_train_end(loop.logs)


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
