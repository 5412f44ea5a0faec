"""Step-exact, atomic backups: the state a restarted run needs to resume at the same update.

A backup is a ``tf.train.Checkpoint`` of the model, the optimizer (its slots,
``iterations`` and, under fp16, the loss scale), tfdist's own counters and the
:class:`Position` (epoch, micro-batches done in it, optimizer updates), so the
weights and the position are written, and committed, together. A save counts
once ``state.json`` is renamed to name it, so a process killed at any moment
leaves the previous backup loadable; :mod:`tfdist.training.backup_files`
describes the files and which filesystems make that commit atomic and durable.

This module is the writer and reader. Only the chief writes ``backup_dir``;
other workers take part in the save (it may read variables through
collectives) into a private temporary directory that is removed straight
away. Every worker of a multi-worker run reads the backup, so ``backup_dir``
must be storage they all share; :mod:`tfdist.training.backup_sync` checks
this and makes every worker resume at the chief's checkpoint.

Security: restoring reads the weight files in ``backup_dir``; point it only at
a directory you trust.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import tempfile
from typing import Any

import keras
import tensorflow as tf

from tfdist.training import backup_files
from tfdist.training.backup_files import PROBE_PREFIX, STATE_FILE, TMP_SUFFIX, checkpoint_name
from tfdist.training.backup_sync import Position, Sync, agree_on_backup_dir, chief_state

__all__ = [
    "Backup",
    "Position",
    "Sync",
    "check_frequency",
    "checkpoint_for",
    "restore_on_every_worker",
    "PROBE_PREFIX",
    "STATE_FILE",
    "TMP_SUFFIX",
]

logger = logging.getLogger(__name__)

# "kill_before_commit:N" SIGKILLs the N-th save between its write and its commit.
_TEST_HOOK = "TFDIST_BACKUP_TEST_HOOK"


def check_frequency(name: str, value: Any, unit: str) -> Any:
    """Validates a backup frequency: ``"epoch"`` or a positive int of ``unit``."""
    from tfdist.config import check_non_negative_int, invalid_argument

    if value == "epoch":
        return value
    expected = f"'epoch' or a positive number of {unit}"
    if check_non_negative_int(name, value, expected=expected) == 0:
        raise invalid_argument(name, value, expected)
    return value


def checkpoint_for(model: Any, optimizer: Any, **extra: Any) -> tf.train.Checkpoint:
    """A checkpoint of the TF variables behind a Keras model and optimizer.

    Tracks the model's variables (RNG seed states included), the optimizer's
    (slots, ``iterations``, the loss scale) and ``extra``. TF saves and
    restores these on every strategy, ``ShardedVariable`` included, which the
    Keras objects themselves do not.
    """

    def tf_variables(variables):
        # keras.Variable.value is the backing TF variable (Mirrored, Sharded,
        # ...) outside an autocast scope, which is where checkpoints are made.
        return [v.value if isinstance(v, keras.Variable) else v for v in variables]

    return tf.train.Checkpoint(
        model=tf_variables(model.variables), optimizer=tf_variables(optimizer.variables), **extra
    )


class _PositionState(tf.train.experimental.PythonState):
    """The position as a string tensor of the checkpoint, saved and read with the weights.

    Not a ``tf.Variable``: one made in a strategy's scope would be mirrored or put on a ps.
    """

    def __init__(self) -> None:
        self.position: Position | None = None

    def serialize(self) -> str:
        return json.dumps(dataclasses.asdict(self.position))

    def deserialize(self, string_value: bytes) -> None:
        self.position = Position(**json.loads(string_value))


class Backup:
    """Saves and restores one run's backups in ``backup_dir``.

    Args:
        backup_dir: The directory (local or any ``tf.io.gfile`` filesystem).
        checkpoint: What to save, e.g. ``tf.train.Checkpoint(model=..., optimizer=...)``
            (None to only :meth:`read_state`).
        is_chief: Whether this process writes ``backup_dir``.
        task_label: ``task_type:task_id`` for temporary names and logs.
        keep_backups: How many of the newest backups ``backup_dir`` holds; the
            older ones are deleted once a newer one is committed.
        replicas: ``num_replicas_in_sync`` of this run, recorded in each backup so that a
            resume on another number of replicas says so (None: not recorded).
    """

    def __init__(
        self,
        backup_dir: str,
        checkpoint: tf.train.Checkpoint | None,
        *,
        is_chief: bool,
        task_label: str | None = None,
        keep_backups: int = 1,
        replicas: int | None = None,
    ) -> None:
        from tfdist.cluster import task_label as label
        from tfdist.config import check_positive_int

        self.backup_dir = backup_dir
        self.checkpoint = checkpoint
        self.is_chief = is_chief
        self.task_label = task_label or label("chief", 0)
        self.keep_backups = check_positive_int("keep_backups", keep_backups)
        self.replicas = replicas
        self._position = _PositionState()
        # What is written: the caller's checkpoint and the position, one set of files
        # (None: a Backup made only to read state.json).
        self._root = (
            None
            if checkpoint is None
            else tf.train.Checkpoint(objects=checkpoint, position=self._position)
        )
        self._saves = 0

    def read_state(self) -> dict[str, Any] | None:
        """The committed ``state.json``, or None when there is no backup yet.

        Raises:
            ValueError: If ``state.json`` is not a backup's state (e.g. another tool's file).
        """
        return backup_files.read_state(self.backup_dir)

    def restore(self, sync: Sync | None = None) -> Position | None:
        """Loads the last committed backup into the tracked objects; every worker calls it.

        With ``sync`` (the runner), the chief's backup wins: every worker
        restores the checkpoint the chief read, once they all see it
        (:func:`tfdist.training.backup_sync.chief_state`).

        Returns:
            Where to resume, or None when ``backup_dir`` holds no backup.

        Raises:
            ValueError: If the workers do not see the same ``backup_dir``.
        """
        state = self.read_state()
        if sync is not None:
            state = chief_state(
                self.backup_dir,
                state,
                sync=sync,
                is_chief=self.is_chief,
                task_label=self.task_label,
            )
        position = self._load(state)
        written_on = position.replicas if position else 0
        if self.is_chief and written_on and self.replicas and written_on != self.replicas:
            # The position counts global batches and updates: it needs no translation, only the
            # same global batch size (which the new replicas must divide; fit checked that).
            logger.warning(
                "Resuming on another world size: the backup was written on %d replicas and "
                "resumes on %d, at the same global step (%d updates done).",
                written_on,
                self.replicas,
                position.updates,
            )
        return position

    def _load(self, state: dict[str, Any] | None) -> Position | None:
        if state is None:
            return None
        prefix = os.path.join(self.backup_dir, state["checkpoint"])
        self._position.position = None
        status = self._root.read(prefix)
        if self._position.position is not None:
            status.assert_existing_objects_matched()
            position = self._position.position
        else:  # written before the position moved into the checkpoint: state.json holds it
            status.expect_partial()  # it matched nothing: its objects sit at the checkpoint's root
            self.checkpoint.read(prefix).assert_existing_objects_matched()
            position = Position(state["epoch"], state["step"], state["updates"])
        logger.info(
            "Restored backup %s: resuming at epoch %d, micro-batch %d (%d updates done)",
            prefix,
            position.epoch + 1,
            position.step,
            position.updates,
        )
        return position

    def save(self, position: Position) -> None:
        """Writes a backup of the current state at ``position``; every worker calls it."""
        self._saves += 1
        state = self.read_state() if self.is_chief else None
        number = (state["number"] + 1) if state else 1
        name = checkpoint_name(number)
        target = (
            self.backup_dir
            if self.is_chief
            else tempfile.mkdtemp(prefix=f"tfdist-backup-{self.task_label.replace(':', '-')}-")
        )
        if self.is_chief:
            tf.io.gfile.makedirs(self.backup_dir)
        if self.replicas:
            position = dataclasses.replace(position, replicas=self.replicas)
        self._position.position = position
        try:
            self._root.write(os.path.join(target, name))
            self._test_hook()
            if self.is_chief:
                entry = {"checkpoint": name, **dataclasses.asdict(position)}
                kept = ((state or {}).get("kept", []) + [entry])[-self.keep_backups :]
                backup_files.commit_state(
                    self.backup_dir, {"number": number, **entry, "kept": kept}
                )
                backup_files.delete_other_checkpoints(
                    self.backup_dir, keep=range(number - self.keep_backups + 1, number + 1)
                )
        finally:
            if not self.is_chief:
                tf.io.gfile.rmtree(target)
        logger.debug("%s saved backup %s at %s", self.task_label, name, position)

    def remove(self) -> None:
        """Deletes the backup after a successful run (chief only).

        Removes every file tfdist put in ``backup_dir`` (leftovers of killed
        writes included), then the directory itself if nothing else is in it.
        """
        if self.is_chief:
            backup_files.remove_backup_files(self.backup_dir)

    def _test_hook(self) -> None:
        spec = os.environ.get(_TEST_HOOK, "")
        if spec.startswith("kill_before_commit:") and self._saves == int(spec.split(":")[1]):
            logger.warning("Test hook: SIGKILL between the checkpoint write and its commit")
            os.kill(os.getpid(), signal.SIGKILL)


def restore_on_every_worker(backup: Backup | None, sync: Sync) -> Position | None:
    """Runs :meth:`Backup.restore` on every worker, or on none; every worker calls it.

    A worker without a ``backup_dir`` while others have one would skip the
    collectives of the restore and hang or mismatch them with its first
    training step, so that is an error on every worker.

    Raises:
        ValueError: If some workers have a ``backup_dir`` and others not, or
            they do not share it.
    """
    agree_on_backup_dir(backup.backup_dir if backup is not None else None, sync)
    return backup.restore(sync) if backup is not None else None
