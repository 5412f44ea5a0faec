"""The epoch loop of ``Trainer.fit``: an epoch's executions, callbacks, step backups, SIGTERM.

`tfdist.training.fit.train_loop.train_epochs` runs the epochs (an iterator per epoch,
validation, epoch-end backups); `EpochLoop` runs one epoch's executions. It starts
updates through one callable, ``start(micro_batches, iterator, num_updates)``,
as Orbit's Controller calls only ``trainer.train(num_steps)``: it knows
nothing of the Trainer. It hands each execution's logs to the callbacks in
order (up to ``runner.max_in_flight`` executions may run ahead, for parameter
servers), takes step-level backups, and acts on SIGTERM at update boundaries:
with a backup it saves and exits 75 for a restart; without one every worker
stops at the same update and exits 143 (128 + SIGTERM). ``model.stop_training``
is voted on the same way, so that one worker's stop stops all at the same update.

The votes, one collective each (every flag at once, ``runner.agree_each``): at each epoch's
end (after ``on_epoch_end``, `EpochLoop.stop_at_epoch_end`), between an epoch's calls, and at
an epoch's start (after ``on_epoch_begin``, which decides the first call's size) only where a
stop may have been asked for since the epoch-end vote: at the fit's first epoch, or when a
worker has a callback of its own with an ``on_epoch_begin`` (Keras's and tfdist's callbacks
never stop there), which the epoch-end vote carries as a third flag. None follows an epoch's
last call: nothing is left to stop there, and a stop or SIGTERM asked for during it is taken
by the epoch-end vote, after the validation and ``on_epoch_end`` (as Keras's ``fit`` still
validates and ends an epoch stopped at its last batch); a SIGTERM between the epoch-end vote
and the next epoch's first call, by the vote after that call. One-call epochs vote once.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

import keras

from tfdist.config import PREEMPTED_EXIT_CODE, TERMINATED_EXIT_CODE
from tfdist.data.inputs import InputSource
from tfdist.strategies.base import STEPS_RUN_KEY, LogsFn, MetricResettingRunner, Runner
from tfdist.training.backup.writer import Backup, Position
from tfdist.training.fit.preemption import PreemptionWatcher
from tfdist.training.health.monitor import Health

logger = logging.getLogger(__name__)

#: ``start(micro_batches, iterator, num_updates)``: starts ``num_updates`` optimizer updates of
#: ``micro_batches`` micro-batches each and returns the runner's logs handle.
StartUpdates = Callable[[int, Any, int], Any]
#: ``validate(epoch, callbacks)``: evaluates after ``epoch`` (or returns {} when that epoch does
#: not validate), calling ``callbacks``' test hooks, and returns the logs.
Validate = Callable[[int, keras.callbacks.CallbackList], dict[str, float]]


def may_stop_at_epoch_begin(callbacks: keras.callbacks.CallbackList) -> bool:
    """Whether a callback may set ``stop_training`` in its ``on_epoch_begin``: one of the
    user's own with that hook (Keras's and tfdist's never stop there)."""
    default = keras.callbacks.Callback.on_epoch_begin
    return any(
        getattr(type(c), "on_epoch_begin", default) is not default
        and not type(c).__module__.startswith(("keras.", "tfdist."))
        for c in callbacks.callbacks
    )


def reset_metrics(runner: Runner, model: keras.Model) -> None:
    """``model.reset_metrics()``, by the runner where it resets them with no collective (at
    each epoch's and evaluation's start: on multi_worker, Keras's own reset is an all-reduce
    per metric variable)."""
    if isinstance(runner, MetricResettingRunner):
        runner.reset_metrics(model)
    else:
        model.reset_metrics()


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


@dataclasses.dataclass(frozen=True)
class FitRun:
    """What one fit's epochs run with, made once by `tfdist.training.fit.run.run_fit`: the
    loop sees these parts, never the Trainer.

    Attributes:
        plan: How an epoch is cut into executions.
        runner: Fetches logs, joins scheduled work and votes across workers.
        model: The compiled model: its metrics are reset per epoch, and its
            ``stop_training`` asks every worker to stop (and is set when another asked).
        start: Starts updates (see `StartUpdates`).
        logs_fn: The logs in cross-replica context, for ``runner.final_logs``.
        source: The training input.
        backup: Where backups go, or None.
        position: Where a restored backup stood, or None.
        validate: Returns an epoch's validation logs (`Validate`), or None for no validation.
        health: The fit's watchdog and straggler report (sections are marked), or None.
    """

    plan: EpochPlan
    runner: Runner
    model: keras.Model
    start: StartUpdates
    logs_fn: LogsFn
    source: InputSource
    backup: Backup | None = None
    position: Position | None = None
    validate: Validate | None = None
    health: Health | None = None


class EpochLoop:
    """One fit call's epochs of executions: logs delivery, step-level backups, preemption.

    Args:
        run: The fit's parts (plan, runner, ``start``, backup, health, ...).
        callbacks: The fit's callbacks, batch hooks called per execution.
        watcher: The SIGTERM watcher, or None.
    """

    def __init__(
        self,
        run: FitRun,
        callbacks: keras.callbacks.CallbackList,
        watcher: PreemptionWatcher | None = None,
    ) -> None:
        self.run = run
        self.health = run.health
        self.plan = run.plan
        self.runner = run.runner
        self.callbacks = callbacks
        self.start = run.start
        self.logs_fn = run.logs_fn
        self.backup = run.backup
        self.watcher = watcher
        # optimizer updates attempted, over all runs (a resumed fit counts the restored ones)
        self.updates = run.position.updates if run.position is not None else 0
        self.logs: Mapping[str, float] = {}  # the last call's (may be computed when first read)
        # (batch, logs handle) of executions started but not fetched yet
        self._pending: collections.deque = collections.deque()
        # Whether the next epoch votes at its start: at the fit's first, then as the epoch-end
        # vote said (some worker's callback may stop in on_epoch_begin).
        self._vote_at_epoch_start = True

    def section(self, name: str) -> contextlib.AbstractContextManager:
        """Marks a section of the fit for the watchdog (see `tfdist.training.health.monitor`)."""
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

    def _vote(self, epoch: int, step: int, *, epoch_begin_may_stop: bool | None = None) -> bool:
        """One collective on every worker: True if any asked to stop; then all stop here.

        One vote carries both flags (``runner.agree_each``): a stop asked for (a SIGTERM, the
        watchdog's, or ``model.stop_training``, so that a callback that stops training on one
        worker only, its own clock say, stops every worker) and a SIGTERM among them, which
        tells a restart from a callback's stop. ``epoch_begin_may_stop``: a third flag, this
        worker's callbacks may stop in ``on_epoch_begin`` (the epoch-end vote's: then the next
        epoch votes at its start if any worker's may).
        """
        requested = self.watcher is not None and self.watcher.requested
        requested = requested or (self.health is not None and self.health.stop_requested)
        with self.section("vote"):
            stop, restart, begin_may_stop = self.runner.agree_each(
                [requested or self.run.model.stop_training, requested, bool(epoch_begin_may_stop)]
            )
        if epoch_begin_may_stop is not None:
            self._vote_at_epoch_start = begin_may_stop
        if not stop:
            return False
        if restart:
            self._stop_for_sigterm(epoch, step)
        self.run.model.stop_training = True
        return True

    def stop_at_epoch_end(self, epoch: int) -> bool:
        """The vote after ``epoch``'s validation and callbacks, at the next epoch's start: True
        if any worker says stop (``stop_training``); a SIGTERM noted since the last update (in
        the validation, say, the last epoch's too) stops the fit here, as at an update."""
        may_stop = may_stop_at_epoch_begin(self.callbacks)
        return self._vote(epoch + 1, 0, epoch_begin_may_stop=may_stop)

    def _vote_at_start(self, epoch: int, step: int) -> bool:
        """The vote at an epoch's start, where a stop may have been asked for since the last."""
        return self._vote(epoch, step) if self._vote_at_epoch_start else False

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
        stopping, calls = self._vote_at_start(epoch, first_step), 0
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
            if done < full_updates or last_window:
                stopping = self._vote(epoch, done * k)
            # else the epoch's last call: the epoch-end vote, after on_epoch_end, takes its stop
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
        stopping = self._vote_at_start(epoch, done)
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
