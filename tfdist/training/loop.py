"""The inner loop of ``Trainer.fit``: one epoch of executions.

It schedules the compiled train function through the runner, hands each
execution's logs to the callbacks in order (up to ``runner.max_in_flight``
executions may run ahead, for parameter servers), and takes step-level backups
and acts on SIGTERM at update boundaries: with a backup it saves and exits 75
for a restart; without one every worker stops at the same update and exits
143 (128 + SIGTERM).
"""
from __future__ import annotations

import collections
import logging
import signal
import threading
from typing import TYPE_CHECKING, Any

import keras

from tfdist.data.inputs import InputSource
from tfdist.config import PREEMPTED_EXIT_CODE, TERMINATED_EXIT_CODE
from tfdist.training.backup import Backup, Position

if TYPE_CHECKING:
    from tfdist.training.trainer import Trainer

logger = logging.getLogger(__name__)


class PreemptionWatcher:
    """Notes SIGTERM so the loop can stop at the next step boundary.

    Args:
        has_backup: Whether the run saves a backup before exiting for a
            restart (else it just stops); only changes the log message.
    """

    def __init__(self, *, has_backup: bool = True) -> None:
        self.requested = False
        self.has_backup = has_backup
        self._previous: Any = None

    def __enter__(self) -> "PreemptionWatcher":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_signal)
        return self

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.has_backup:
            logger.warning("SIGTERM: saving a backup at the next step boundary, then exiting for a restart")
        else:
            logger.warning("SIGTERM: stopping at the next step boundary (no backup_dir, so nothing is saved)")
        self.requested = True

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


class EpochRunner:
    """One fit call's epochs: executions, logs delivery, step-level backups, preemption."""

    def __init__(self, trainer: "Trainer", callbacks: keras.callbacks.CallbackList, source: InputSource,
                 train_fn: Any, steps: int, backup: Backup | None, *, updates: int) -> None:
        self.trainer = trainer
        self.runner = trainer._runner
        self.callbacks = callbacks
        self.source = source
        self.train_fn = train_fn
        self.steps = steps
        self.backup = backup
        self.updates = updates  # optimizer updates attempted, over all runs
        self.watcher: PreemptionWatcher | None = None
        self.logs: dict[str, float] = {}
        self._pending: collections.deque = collections.deque()  # (batch, logs handle), not fetched yet

    def _deliver(self, limit: int) -> None:
        while len(self._pending) > limit:
            batch, handle = self._pending.popleft()
            self.logs = self.runner.fetch(handle)
            self.callbacks.on_train_batch_end(batch, self.logs)

    def _call(self, fn: Any, iterator: Any, num_updates: int, first_batch: int, last_batch: int) -> None:
        self.callbacks.on_train_batch_begin(first_batch)
        self._pending.append((last_batch, self.trainer._start(fn, iterator, num_updates)))
        self._deliver(self.runner.max_in_flight)

    def _save(self, epoch: int, step: int) -> None:
        self._deliver(0)
        self.runner.join()
        self.backup.save(Position(epoch, step, self.updates))

    def _stop_for_sigterm(self, epoch: int, step: int) -> None:
        """Every worker gets here at the same update: ``agree`` voted on the SIGTERM."""
        if self.backup is not None:
            self._save(epoch, step)
            logger.warning("Saved a backup at epoch %d, micro-batch %d after SIGTERM; exiting with code %d "
                           "so the launcher restarts this run.", epoch + 1, step, PREEMPTED_EXIT_CODE)
            raise SystemExit(PREEMPTED_EXIT_CODE)
        self._deliver(0)
        self.runner.join()
        logger.warning("Stopped at epoch %d, micro-batch %d (%d updates) after SIGTERM; no backup_dir, so "
                       "nothing was saved. Exiting with code %d.", epoch + 1, step, self.updates,
                       TERMINATED_EXIT_CODE)
        raise SystemExit(TERMINATED_EXIT_CODE)

    def epoch(self, epoch: int, iterator: Any, *, first_step: int = 0) -> dict[str, float]:
        """Trains one epoch from micro-batch ``first_step`` and returns its logs."""
        trainer, model, k = self.trainer, self.trainer.model, self.trainer.accumulation_steps
        full_updates, last_window = divmod(self.steps, k)
        per_call = max(trainer.steps_per_execution // k, 1)
        freq = trainer.backup_freq
        done = first_step // k
        while done < full_updates and not model.stop_training:
            n = min(per_call, full_updates - done)
            if isinstance(freq, int) and self.backup is not None:
                n = min(n, freq - self.updates % freq)  # a call ends where a backup is due
            self._call(self.train_fn, iterator, n, done * k, (done + n) * k - 1)
            done += n
            before, self.updates = self.updates, self.updates + n
            crossed = isinstance(freq, int) and before // freq != self.updates // freq
            if self.backup is not None and crossed and done * k < self.steps:  # the epoch end saves anyway
                self._save(epoch, done * k)
            if self.watcher is not None and self.runner.agree(self.watcher.requested):
                self._stop_for_sigterm(epoch, done * k)
        if last_window and not model.stop_training:
            # The epoch's last `last_window` micro-batches make one smaller
            # update, still a true mean over its examples.
            fn = trainer._train_function(self.source.global_batch_size, last_window)
            self._call(fn, iterator, 1, done * k, self.steps - 1)
            self.updates += 1
        self._deliver(0)
        self.logs = self.runner.final_logs(trainer._logs, self.logs)
        return dict(self.logs)
