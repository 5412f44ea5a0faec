"""Keras callbacks in a multi-worker run: only the chief writes for real.

Every worker runs the same callbacks (saving may read variables through
collectives, so all workers must take part), but on a non-chief worker each
known file-writing callback is pointed at a private temporary directory that
is removed at the end of training.
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from typing import Iterator, Sequence

import keras

logger = logging.getLogger(__name__)

# Callback type -> the attribute that holds where it writes.
_PATH_ATTRIBUTES = (
    (keras.callbacks.ModelCheckpoint, "filepath"),
    (keras.callbacks.TensorBoard, "log_dir"),
    (keras.callbacks.CSVLogger, "filename"),
)


@contextlib.contextmanager
def chief_writes_only(callbacks: Sequence[keras.callbacks.Callback], *, is_chief: bool,
                      task_label: str) -> Iterator[None]:
    """Redirects file-writing callbacks to a temporary place on non-chief workers.

    Args:
        callbacks: The user's callbacks; their paths are restored afterwards.
        is_chief: Whether this process is the chief (then nothing changes).
        task_label: ``task_type:task_id``, used in the temporary directory name.
    """
    if is_chief:
        yield
        return
    tmp = tempfile.mkdtemp(prefix=f"tfdist-{task_label.replace(':', '-')}-")
    saved = []
    try:
        for cb in callbacks:
            for cls, attr in _PATH_ATTRIBUTES:
                if isinstance(cb, cls) and getattr(cb, attr, None):
                    original = str(getattr(cb, attr))
                    saved.append((cb, attr, original))
                    setattr(cb, attr, os.path.join(tmp, os.path.basename(original.rstrip("/")) or "out"))
        yield
    finally:
        for cb, attr, original in saved:
            setattr(cb, attr, original)
        shutil.rmtree(tmp, ignore_errors=True)
        logger.debug("%s removed its temporary callback outputs in %s", task_label, tmp)


class BackupAndRestore(keras.callbacks.Callback):
    """Step-exact, atomic, chief-written backups for plain ``model.fit``.

    Keras 3's own ``BackupAndRestore`` resumes at the start of the epoch (the
    batches already done are trained on again), lets every worker write the
    same file, and writes it in place. This one saves the same state as
    ``Trainer(backup_dir=...)`` (see :mod:`tfdist.training.backup`): on a
    restart, ``fit`` resumes at the epoch *and* batch of the last backup,
    skipping the batches it had already trained on.

    Example::

        model.fit(ds, epochs=5, callbacks=[tfdist.callbacks.BackupAndRestore("/tmp/backup", save_freq=50)])

    The skipped batches are the same ones only if the dataset yields the same
    order on every run (e.g. shuffled with a fixed seed and
    ``reshuffle_each_iteration=False``, or a tfdist ``DatasetFn``).

    Args:
        backup_dir: Where the backup lives (only the chief writes it). Restoring
            loads weight files: use a trusted directory.
        save_freq: ``"epoch"``, or a number of ``train_function`` calls
            (batches, or ``steps_per_execution`` batches) between backups.
        keep_backup: Keep the backup after training finishes.
    """

    def __init__(self, backup_dir: str, save_freq: int | str = "epoch", keep_backup: bool = False) -> None:
        super().__init__()
        from tfdist.config import check_directory
        from tfdist.training.backup import check_frequency

        check_frequency("save_freq", save_freq, "batches")
        check_directory("backup_dir", backup_dir, allow_none=False)
        self.backup_dir = backup_dir
        self.save_freq = save_freq
        self.keep_backup = keep_backup
        self._backup = None
        self._epoch = 0
        self._calls = 0  # train_function calls in this epoch
        self._updates = 0

    def on_train_begin(self, logs=None):
        from tfdist.training.backup import Backup, checkpoint_for

        model = self.model
        strategy = model.distribute_strategy
        if model.optimizer is not None and not model.optimizer.built:
            with strategy.scope():
                model.optimizer.build(model.trainable_variables)
        checkpoint = checkpoint_for(model, model.optimizer)
        resolver = getattr(strategy, "cluster_resolver", None)
        label = f"{getattr(resolver, 'task_type', None) or 'worker'}:{getattr(resolver, 'task_id', None) or 0}"
        self._backup = Backup(self.backup_dir, checkpoint, is_chief=bool(strategy.extended.should_checkpoint),
                              task_label=label)
        position = self._backup.restore()
        if position is None:
            return
        if strategy.extended.should_checkpoint:  # the chief tells the user why an epoch starts again
            logger.warning("Resumed from update %d (epoch %d, step %d) of the backup in %s.",
                           position.updates, position.epoch + 1, position.step, self.backup_dir)
        model._initial_epoch = position.epoch
        self._updates = position.updates
        to_skip = {"calls": position.step}
        original = model.train_function
        per_call = max(int(getattr(model, "steps_per_execution", 1) or 1), 1)

        def train_function(iterator):
            # The first calls of the resumed epoch only step past batches the
            # previous run already trained on.
            if to_skip["calls"] > 0:
                to_skip["calls"] -= 1
                for _ in range(per_call):
                    next(iterator)
                return {}
            return original(iterator)

        model.train_function = train_function

    def on_epoch_begin(self, epoch, logs=None):
        self._calls = 0  # skipped calls of a resumed epoch count here too
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        from tfdist.training.backup import Position

        self._calls += 1
        if not logs:  # a skipped call of the resumed epoch
            return
        self._updates += 1
        if isinstance(self.save_freq, int) and self._updates % self.save_freq == 0:
            self._backup.save(Position(self._epoch, self._calls, self._updates))

    def on_epoch_end(self, epoch, logs=None):
        from tfdist.training.backup import Position

        self._calls = 0
        self._backup.save(Position(epoch + 1, 0, self._updates))

    def on_train_end(self, logs=None):
        if self._backup is not None and not self.keep_backup:
            self._backup.remove()
