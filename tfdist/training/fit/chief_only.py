"""Keras callbacks in a multi-worker run: only the chief writes for real.

Every worker runs the same callbacks (saving may read variables through
collectives, so all workers must take part), but on a non-chief worker each
known file-writing callback (``ModelCheckpoint``, ``TensorBoard``,
``CSVLogger``) is pointed at a private temporary directory that is removed at
the end of training, and the callbacks that only show or send the logs
(``ProgbarLogger``, ``RemoteMonitor``) do not run at all.

`FitCallbackList` is the fit's ``CallbackList``: Keras's, except that
batch logs computed on first read (``tfdist.logs.LazyLogs``) reach the
callbacks unread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

import keras

from tfdist._compat.keras_internals.fit_hooks import (
    calling_callback_list,
    progress_bar_draws,
    set_initial_epoch,
)
from tfdist.logs import LazyLogs

logger = logging.getLogger(__name__)

# Callback type -> the attribute that holds where it writes.
_PATH_ATTRIBUTES = (
    (keras.callbacks.ModelCheckpoint, "filepath"),
    (keras.callbacks.TensorBoard, "log_dir"),
    (keras.callbacks.CSVLogger, "filename"),
)

# Callbacks whose only effect is to show or send the logs, which are the same on every worker.
_CHIEF_ONLY = (keras.callbacks.ProgbarLogger, keras.callbacks.RemoteMonitor)


def for_this_worker(
    callbacks: Sequence[keras.callbacks.Callback], *, is_chief: bool
) -> list[keras.callbacks.Callback]:
    """The callbacks this process runs: all on the chief; elsewhere, not those that only show logs.

    A ``ProgbarLogger`` or ``RemoteMonitor`` shows (or POSTs) each epoch's
    logs; those are global, so the chief's copy says it all, once.
    """
    return [c for c in callbacks if is_chief or not isinstance(c, _CHIEF_ONLY)]


class FitCallbackList(keras.callbacks.CallbackList):
    """Keras's ``CallbackList``; batch logs computed on first read reach the callbacks unread.

    Keras's list converts each batch's logs to flat Python floats, keys sorted,
    before any callback sees them: reading every value. A ``LazyLogs`` (the
    parameter-server runner's) already is that dict once read, so it is passed
    as it is, and only a callback or progress bar that reads a value pays for
    computing them. Keras's progress bar (``verbose=1``) is given a batch's
    logs only when it will draw them: at most every 0.05 s, as it redraws.
    Other logs go through Keras's conversion as before.
    """

    @property
    def reads_batch_logs(self) -> bool:
        """Whether a callback may read the logs of a training batch.

        Only a batch-end hook (``on_train_batch_end``, ``on_batch_end``) receives
        them; Keras's progress bar reads them only to show them (``verbose=1``).
        """
        return any(_reads_batch_logs(callback) for callback in self.callbacks)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if not isinstance(logs, LazyLogs):
            super().on_train_batch_end(batch, logs)
            return
        for callback in self.callbacks:
            if type(callback) is keras.callbacks.ProgbarLogger and not progress_bar_draws(
                callback, batch
            ):
                # The bar would not draw this batch's values: they are not read, and its count
                # moves on as Keras's would (each draw shows that batch's own running values).
                callback.seen = batch + 1
                continue
            callback.on_train_batch_end(batch, logs=logs)


def _reads_batch_logs(callback: keras.callbacks.Callback) -> bool:
    """Whether ``callback`` has a batch-end hook of its own (Keras's progress bar: at verbose=1)."""
    if type(callback) is keras.callbacks.ProgbarLogger:
        return callback.verbose == 1
    default = keras.callbacks.Callback
    return any(
        getattr(getattr(callback, hook), "__func__", None) is not getattr(default, hook)
        for hook in ("on_train_batch_end", "on_batch_end")
    )


@contextlib.contextmanager
def chief_writes_only(
    callbacks: Sequence[keras.callbacks.Callback], *, is_chief: bool, task_label: str
) -> Iterator[None]:
    """Redirects file-writing callbacks to a temporary place on non-chief workers.

    Enter it before the callbacks meet the model (before building the
    ``CallbackList``): ``TensorBoard.set_model`` caches its log paths.

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
                    # The documented constructor argument, kept as a public attribute of a Keras
                    # callback (not a TF object), and put back in the finally below.
                    setattr(
                        cb, attr, os.path.join(tmp, os.path.basename(original.rstrip("/")) or "out")
                    )
        yield
    finally:
        for cb, attr, original in saved:
            setattr(cb, attr, original)
        shutil.rmtree(tmp, ignore_errors=True)
        logger.debug("%s removed its temporary callback outputs in %s", task_label, tmp)


class _ResumeSkip:
    """Steps a resumed epoch past the batches already trained on, unseen by the other callbacks.

    Keras's ``fit`` still makes one ``train_function`` call per skipped call;
    here those calls only advance the iterator, and the ``CallbackList``
    drops their ``on_train_batch_begin``/``end``, so callbacks (the progress
    bar, TensorBoard, ...) see the trained batches only, with their real
    indices in the epoch.
    """

    def __init__(
        self, model: keras.Model, calls: int, callback_list: keras.callbacks.CallbackList | None
    ) -> None:
        self.left = calls
        self.skipped_last = False
        self.model = model
        self.original = model.train_function
        per_call = max(int(getattr(model, "steps_per_execution", 1) or 1), 1)

        def train_function(iterator):
            if self.left > 0:
                self.left -= 1
                self.skipped_last = True
                for _ in range(per_call):
                    next(iterator)
                return {}
            self.skipped_last = False
            return self.original(iterator)

        # ``train_function`` is the public attribute that ``fit`` calls (``make_train_function``
        # sets it); ``undo`` puts it back.
        model.train_function = train_function
        if callback_list is not None:
            begin, end = callback_list.on_train_batch_begin, callback_list.on_train_batch_end

            def on_train_batch_begin(batch, logs=None):
                if self.left == 0:  # else this call will only skip
                    begin(batch, logs)

            def on_train_batch_end(batch, logs=None):
                if not self.skipped_last:
                    end(batch, logs)

            # Instance attributes of this fit's own CallbackList (a Keras object that lives only
            # as long as the fit call): the one place that reaches every callback.
            callback_list.on_train_batch_begin = on_train_batch_begin
            callback_list.on_train_batch_end = on_train_batch_end

    def undo(self) -> None:
        self.model.train_function = self.original


class BackupAndRestore(keras.callbacks.Callback):
    """Step-exact, atomic, chief-written backups for plain ``model.fit``.

    Keras 3's own ``BackupAndRestore`` resumes at the start of the epoch (the
    batches already done are trained on again), lets every worker write the
    same file, and writes it in place. This one saves the same state as
    ``Trainer(backup_dir=...)`` (see `tfdist.training.backup.writer`): on a
    restart, ``fit`` resumes at the epoch *and* batch of the last backup,
    skipping the batches it had already trained on. The other callbacks see
    only the batches trained on, with their indices in the epoch (the
    progress bar of a resumed epoch starts where the backup was taken).

    Example:
        ```python
        backup = tfdist.callbacks.BackupAndRestore("/tmp/backup", save_freq=50)
        model.fit(ds, epochs=5, callbacks=[backup])
        ```

    Given to ``tfdist.Trainer.fit`` instead, it becomes that fit's
    ``tfdist.BackupOptions`` (``save_freq`` then counts optimizer updates),
    as does Keras's own ``BackupAndRestore``.

    The skipped batches are the same ones only if the dataset yields the same
    order on every run (e.g. shuffled with a fixed seed and
    ``reshuffle_each_iteration=False``, or a tfdist ``DatasetFn``).

    Args:
        backup_dir: Where the backup lives (only the chief writes it); any
            ``tf.io.gfile`` path, shared by all workers. Restoring loads weight
            files: use a trusted directory.
        save_freq: ``"epoch"``, or a number of ``train_function`` calls
            (batches, or ``steps_per_execution`` batches) between backups.
        keep_backup: Keep the backup after training finishes.
        keep_backups: How many of the newest backups ``backup_dir`` holds.
    """

    def __init__(
        self,
        backup_dir: str,
        save_freq: int | str = "epoch",
        keep_backup: bool = False,
        *,
        keep_backups: int = 1,
    ) -> None:
        super().__init__()
        from tfdist.config import check_directory, check_positive_int
        from tfdist.training.backup.writer import check_frequency

        check_frequency("save_freq", save_freq, "batches")
        check_directory("backup_dir", backup_dir, allow_none=False)
        self.backup_dir = backup_dir
        self.save_freq = save_freq
        self.keep_backup = keep_backup
        self.keep_backups = check_positive_int("keep_backups", keep_backups)
        self._backup = None
        self._epoch = 0
        self._calls = 0  # train_function calls in this epoch, skipped ones included
        self._updates = 0
        self._resume: tuple[int, int] | None = None  # (epoch, calls already done in it)
        self._skip: _ResumeSkip | None = None

    def on_train_begin(self, logs=None):
        from tfdist.strategies.factory import runner_for
        from tfdist.training.backup.writer import Backup, checkpoint_for

        callback_list = calling_callback_list(self)
        if callback_list is None:
            logger.warning(
                "BackupAndRestore was not called from a keras CallbackList: the batches "
                "skipped on resume will still reach the other callbacks."
            )
        model = self.model
        strategy = model.distribute_strategy
        if model.optimizer is not None and not model.optimizer.built:
            with strategy.scope():
                model.optimizer.build(model.trainable_variables)
        checkpoint = checkpoint_for(model, model.optimizer)
        runner = runner_for(strategy)
        self._backup = Backup(
            self.backup_dir,
            checkpoint,
            is_chief=runner.is_chief,
            task_label=runner.task_label,
            keep_backups=self.keep_backups,
            replicas=strategy.num_replicas_in_sync,
        )
        position = self._backup.restore(runner)  # every worker resumes at the chief's position
        self._resume, self._skip = None, None
        if position is None:
            return
        if runner.is_chief:  # the chief tells the user why an epoch starts again
            logger.warning(
                "Resumed from update %d (epoch %d, step %d) of the backup in %s.",
                position.updates,
                position.epoch + 1,
                position.step,
                self.backup_dir,
            )
        set_initial_epoch(model, position.epoch)  # no public way: see _compat.keras_callbacks
        self._updates = position.updates
        self._resume = (position.epoch, position.step)
        if position.step:
            self._skip = _ResumeSkip(model, position.step, callback_list)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._calls = self._resume[1] if self._resume and self._resume[0] == epoch else 0

    def on_train_batch_end(self, batch, logs=None):
        from tfdist.training.backup.writer import Position

        if self._skip is not None and self._skip.skipped_last:
            return  # a skipped call (only when the CallbackList could not be found)
        self._calls += 1
        self._updates += 1
        if isinstance(self.save_freq, int) and self._updates % self.save_freq == 0:
            self._backup.save(Position(self._epoch, self._calls, self._updates))

    def on_epoch_end(self, epoch, logs=None):
        from tfdist.training.backup.writer import Position

        self._calls = 0
        self._backup.save(Position(epoch + 1, 0, self._updates))

    def on_train_end(self, logs=None):
        if self._skip is not None:
            self._skip.undo()
            self._skip = None
        if self._backup is not None and not self.keep_backup:
            self._backup.remove()
