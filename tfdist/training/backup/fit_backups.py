"""How the Trainer backs up and resumes: what it checkpoints, where a fit starts again, and cleanup.

The files, the atomic commit and the restore protocol are
`tfdist.training.backup.writer`'s; this module only decides, for each ``fit``,
which ``Backup`` to use (``BackupOptions`` or none), restores it on every
worker, waits for its last (asynchronous) commit at the end of the fit, and
removes it after a successful run unless asked to keep it.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Callable, Iterator
from typing import Any

import keras
import tensorflow as tf

from tfdist.strategies.base import Runner
from tfdist.training.backup.writer import Backup, Position, checkpoint_for, restore_on_every_worker
from tfdist.training.options import BackupOptions

logger = logging.getLogger(__name__)


class FitBackups:
    """A Trainer's backups: the ``Backup`` each ``fit`` uses (the same one while its options are).

    Args:
        options: Where and how often to back up; None for no backups.
        model: The compiled model (its optimizer is backed up with it).
        runner: The strategy's runner (chief, task label, collectives).
        skipped_updates: The loss-scaling skip counter, backed up when given.
        sharded: Returns the sharded optimizer state once built (None: not sharded), whose
            slots the backup saves whole (and, under ``sharding="parameters"``, the weights'
            blocks: whole too).
        local_sgd: Returns local SGD's state once built (None: off), whose last synced
            parameters, outer optimizer, sync count and every replica's own state the backup
            holds (`tfdist.training.local_sgd.sync.LocalState.checkpointed`): gathered before
            each save, handed back to each replica (or averaged, on another replica count)
            after a restore.
    """

    def __init__(
        self,
        options: BackupOptions | None,
        *,
        model: keras.Model,
        runner: Runner,
        skipped_updates: tf.Variable | None = None,
        sharded: Callable[[], Any] = lambda: None,
        local_sgd: Callable[[], Any] = lambda: None,
    ) -> None:
        self.options = options
        self._model = model
        self._runner = runner
        self._extra = {} if skipped_updates is None else {"skipped_updates": skipped_updates}
        self._checkpoint: tf.train.Checkpoint | None = None
        self._sharded = sharded
        self._local_sgd = local_sgd
        # The last fit's Backup by its options (one entry), shared with for_fit's copies.
        self._opened: dict[BackupOptions, Backup] = {}

    def for_fit(self, options: BackupOptions | None) -> FitBackups:
        """These backups, or the same model's under ``options`` (a backup callback's) if given."""
        if options is None:
            return self
        other = copy.copy(self)  # shares the model, runner and checkpoint, not the options
        other.options = options
        return other

    def open(self) -> Backup | None:
        """This fit's ``Backup``, or None without ``BackupOptions``; every worker calls it.

        The same ``Backup`` serves every fit under the same options: an
        asynchronous one keeps its host copies of the variables and its
        compiled copy function from one fit to the next.
        """
        if self.options is None:
            return None
        local = self._local_sgd()
        if self._checkpoint is None:
            # Made at the first fit, once the model and optimizer are built: a checkpoint tracks the
            # variables that exist when it is made. Later fits reuse it.
            extra = (
                self._extra if local is None else {**self._extra, "local_sgd": local.checkpointed()}
            )
            self._checkpoint = checkpoint_for(
                self._model,
                self._model.optimizer,
                sharded=self._sharded(),
                strategy=self._runner.strategy,
                **extra,
            )
        if self.options not in self._opened:
            self._opened.clear()
            self._opened[self.options] = Backup(
                self.options.dir,
                self._checkpoint,
                is_chief=self._runner.is_chief,
                task_label=self._runner.task_label,
                keep_backups=self.options.keep_last,
                replicas=self._runner.strategy.num_replicas_in_sync,
                asynchronous=self.options.asynchronous,
                before_save=None if local is None else local.copies.gather,
            )
        return self._opened[self.options]

    def restore(self, backup: Backup | None) -> Position | None:
        """The chief's backup position, restored on every worker (None: start afresh)."""
        local = self._local_sgd()
        if backup is not None and local is not None:
            local.check_backup(backup)  # another fragments= refused before any value is read
        position = restore_on_every_worker(backup, self._runner)
        if position is not None and local is not None:
            _log_local_resume(local.copies.restore(), position, self._runner)
        if position is not None and self._runner.is_chief:
            # A warning, so the user sees why an epoch's progress bar starts again.
            logger.warning(
                "Resumed from update %d (epoch %d, step %d) of the backup in %s.",
                position.updates,
                position.epoch + 1,
                position.step,
                backup.backup_dir,
            )
        return position

    @contextlib.contextmanager
    def during(self, backup: Backup | None) -> Iterator[None]:
        """Around a fit's epochs: `finish` after success, `abandon` after a failure.

        So no fit returns or raises with a backup still being written.
        """
        try:
            yield
        except BaseException:
            self.abandon(backup)
            raise
        self.finish(backup)

    def finish(self, backup: Backup | None) -> None:
        """After a successful fit: waits for the last backup's commit (raising its failure), then
        removes the backups unless ``keep_after_success``."""
        if backup is None:
            return
        backup.wait()
        if not self.options.keep_after_success:
            backup.remove()

    def abandon(self, backup: Backup | None) -> None:
        """After a failed fit: waits for the backup in flight, logging (not raising) its failure.

        A complete checkpoint is committed even though the fit failed, so the
        restart resumes from the newest backup; the fit's own error is the one raised.
        """
        if backup is None:
            return
        try:
            backup.wait()
        except RuntimeError as e:
            logger.error("%s", e)


def _log_local_resume(done: str, position: Position, runner: Runner) -> None:
    """The chief's warning when a local-SGD round resumes on another replica count."""
    replicas = runner.strategy.num_replicas_in_sync
    if not runner.is_chief or done not in ("averaged", "slots"):
        return
    synced = (
        "the partial round synced at the resume (their parameters and statistics averaged, "
        "through the outer optimizer with DiLoCo)"
        if done == "averaged"
        else "taken right after a sync (nothing to average)"
    )
    logger.warning(
        "Local SGD: a backup of %d replicas resumes on %d at update %d, %s; the inner "
        "optimizer's state is replica 0's.",
        position.replicas,
        replicas,
        position.updates,
        synced,
    )
