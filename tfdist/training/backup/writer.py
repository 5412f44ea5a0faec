"""Step-exact, atomic backups: the state a restarted run needs to resume at the same update.

A backup is a ``tf.train.Checkpoint`` of the model, the optimizer (its slots,
``iterations`` and, under fp16, the loss scale), tfdist's own counters and the
`Position` (epoch, micro-batches done in it, optimizer updates), so the
weights and the position are written, and committed, together. A save counts
once ``state.json`` is renamed to name it, so a process killed at any moment
leaves the previous backup loadable; `tfdist.training.backup.files`
describes the files and which filesystems make that commit atomic and durable.

This module is the writer and reader. Only the chief writes ``backup_dir``;
other workers take part in the save (it may read variables through
collectives) into a private temporary directory that is removed once their
write is complete.

Asynchronous saves (the Trainer's default): ``save`` copies the values to host
memory (TF's asynchronous checkpointing) and returns; TF's writer thread
writes the files and then, as the write's callback, runs the commit (fsyncs,
``state.json``, cleanup), while training goes on. One backup is in flight at
a time: the next ``save``, ``restore``, ``remove`` and `Backup.wait`
first wait for its commit and raise its failure. A kill at any moment still
leaves the previous committed backup.

Every worker of a multi-worker run reads the backup, so ``backup_dir`` must be
storage they all share; `tfdist.training.backup.sync` checks
this and makes every worker resume at the chief's checkpoint.

Security: restoring reads the weight files in ``backup_dir``; point it only at
a directory you trust.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import keras
import tensorflow as tf

from tfdist._compat.tf_internals.checkpoint import (
    WrittenFromItself,
    release_async_writer,
    take_async_write_error,
)
from tfdist.training.backup import files as backup_files
from tfdist.training.backup.files import PROBE_PREFIX, STATE_FILE, TMP_SUFFIX, checkpoint_name
from tfdist.training.backup.sync import Position, Sync, agree_on_backup_dir, chief_state
from tfdist.training.zero.checkpoint import consolidated
from tfdist.training.zero.parameters import ParameterState

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

if TYPE_CHECKING:
    from tfdist.training.zero.state import ShardedState

logger = logging.getLogger(__name__)

# "kill_before_commit:N" SIGKILLs the N-th save between its write and its commit (in TF's
# writer thread when asynchronous, while training goes on).
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


def checkpoint_for(
    model: Any,
    optimizer: Any,
    *,
    sharded: ShardedState | ParameterState | None = None,
    strategy: tf.distribute.Strategy | None = None,
    **extra: Any,
) -> tf.train.Checkpoint:
    """A checkpoint of the TF variables behind a Keras model and optimizer.

    Tracks the model's variables (RNG seed states included), the optimizer's
    (slots, ``iterations``, the loss scale) and ``extra``. TF saves and
    restores these on every strategy, ``ShardedVariable`` included, which the
    Keras objects themselves do not. With ``sharded`` (optimizer state sharded
    over ``strategy``'s replicas), each sharded slot is saved whole, as an
    unsharded run saves it (`tfdist.training.zero.checkpoint`); under
    ``sharding="parameters"`` the model's trainable variables too, from their blocks
    (`tfdist.training.zero.parameters.ParameterState.in_checkpoint`).
    """

    def tf_variables(variables):
        # keras.Variable.value is the backing TF variable (Mirrored, Sharded,
        # ...) outside an autocast scope, which is where checkpoints are made.
        return [v.value if isinstance(v, keras.Variable) else v for v in variables]

    model_variables, full_shapes = list(model.variables), {}
    if sharded is not None:
        full_shapes = dict(sharded.full_shapes)
    if isinstance(sharded, ParameterState):  # during a fit the weights live only as blocks
        model_variables = sharded.in_checkpoint(model_variables)
        full_shapes.update(sharded.block_shapes)
    held = tf_variables(model_variables) + tf_variables(optimizer.variables)
    held = consolidated(held, full_shapes, strategy)
    n = len(model_variables)
    return tf.train.Checkpoint(model=held[:n], optimizer=held[n:], **extra)


class _PositionState(WrittenFromItself):
    """The position as a string tensor of the checkpoint, saved and read with the weights.

    Not a ``tf.Variable``: one made in a strategy's scope would be mirrored or put on a ps.
    An asynchronous write serializes it in TF's writer thread, so it is set only once the
    previous save is committed.
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
            (None to only `read_state`).
        is_chief: Whether this process writes ``backup_dir``.
        task_label: ``task_type:task_id`` for temporary names and logs.
        keep_backups: How many of the newest backups ``backup_dir`` holds; the
            older ones are deleted once a newer one is committed.
        replicas: ``num_replicas_in_sync`` of this run, recorded in each backup so that a
            resume on another number of replicas says so (None: not recorded).
        asynchronous: `save` returns once the values are copied to host
            memory; the files are written and committed in the background, one
            backup at a time (see `save`, `wait`).
        before_save: Called on every worker at each `save`, before the values are copied
            (local SGD gathers each replica's own state there:
            `tfdist.training.local_sgd.replicas.ReplicaCopies.gather`); None: nothing.
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
        asynchronous: bool = False,
        before_save: Callable[[], None] | None = None,
    ) -> None:
        from tfdist.cluster import task_label as label
        from tfdist.config import check_positive_int

        self.backup_dir = os.fspath(backup_dir)  # a pathlib.Path too
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
        # What save() writes through: TF's asynchronous writer lives on it, so reads go through
        # self._root alone (a Checkpoint that wrote asynchronously also reads through its writer).
        self._writer = (
            None
            if checkpoint is None
            else tf.train.Checkpoint(objects=checkpoint, position=self._position)
        )
        self.asynchronous = asynchronous
        self._before_save = before_save
        # The commit of the asynchronous save not waited for yet.
        self._in_flight: backup_files.Commit | None = None
        self._saves = 0
        if asynchronous and self._writer is not None:
            # Not at exit: TF's own atexit hook ends the writer then (after which a sync() of
            # ours would wait forever: the thread's stop marker is never marked done).
            weakref.finalize(self, _release_writer, self._writer, self.task_label).atexit = False

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
        (`tfdist.training.backup.sync.chief_state`).

        Returns:
            Where to resume, or None when ``backup_dir`` holds no backup.

        Raises:
            ValueError: If the workers do not see the same ``backup_dir``.
        """
        self.wait()
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
        """Writes a backup of the current state at ``position``; every worker calls it.

        First waits for the previous backup's commit (raising its failure, if
        any). Asynchronous: returns once the values are copied to host memory;
        the files are written and committed in TF's writer thread while
        training goes on (`wait` waits for that). Synchronous: returns
        once the backup is committed.

        Raises:
            RuntimeError: If the previous asynchronous backup failed (naming ``backup_dir``).
        """
        self.wait()
        if self._before_save is not None:
            self._before_save()  # every worker: it may gather through collectives
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
        # Serialized with the weights, in the writer thread when asynchronous: it stays
        # unchanged until this save is committed (the next save waits first).
        self._position.position = position
        commit = backup_files.Commit(
            self.backup_dir,
            name,
            state=self._next_state(state, number, name, position) if self.is_chief else None,
            keep=range(number - self.keep_backups + 1, number + 1),
            temp_dir=None if self.is_chief else target,
            kill=self._kill_hook_due(),
            label=self.task_label,
            position=position,
        )
        options = tf.train.CheckpointOptions(
            enable_async=self.asynchronous, experimental_write_callbacks=[commit]
        )
        try:
            # The commit runs as the write's callback: only once the files are complete.
            self._writer.write(os.path.join(target, name), options=options)
        except BaseException:
            commit.remove_temp_dir()
            raise
        if self.asynchronous:
            self._in_flight = commit

    def _next_state(
        self, state: dict[str, Any] | None, number: int, name: str, position: Position
    ) -> dict[str, Any]:
        entry = {"checkpoint": name, **dataclasses.asdict(position)}
        kept = ((state or {}).get("kept", []) + [entry])[-self.keep_backups :]
        return {"number": number, **entry, "kept": kept}

    def wait(self) -> None:
        """Waits until the asynchronous backup in flight, if any, is committed.

        Raises:
            RuntimeError: If it failed (disk full, permissions, ...): the
                message names ``backup_dir`` and the checkpoint; the previous
                committed backup is still the one ``state.json`` names.
        """
        commit, self._in_flight = self._in_flight, None
        if commit is None:
            return
        self._writer.sync()
        error = take_async_write_error(self._writer)
        commit.remove_temp_dir()  # a failed write never reached its callback
        if error is not None:
            raise RuntimeError(
                f"{self.task_label}: the backup {commit.name} (at {commit.position}) "
                f"failed while it was written and committed in the background, in "
                f"backup_dir={self.backup_dir!r}: {type(error).__name__}: {error}. The last "
                "committed backup is still the one its state.json names. Check the space "
                "and permissions of backup_dir."
            ) from error

    def remove(self) -> None:
        """Deletes the backup after a successful run (chief only), once the last save committed.

        Removes every file tfdist put in ``backup_dir`` (leftovers of killed
        writes included), then the directory itself if nothing else is in it.
        """
        self.wait()
        if self.is_chief:
            backup_files.remove_backup_files(self.backup_dir)

    def _kill_hook_due(self) -> bool:
        spec = os.environ.get(_TEST_HOOK, "")
        return spec.startswith("kill_before_commit:") and self._saves == int(spec.split(":")[1])


def _release_writer(writer: tf.train.Checkpoint, label: str) -> None:
    """Ends an asynchronous writer's thread and frees its host copies (a Backup is collected)."""
    writer.sync()
    error = take_async_write_error(writer)
    if error is not None:
        logger.error("%s: the last backup failed in the background: %s", label, error)
    release_async_writer(writer)


def restore_on_every_worker(backup: Backup | None, sync: Sync) -> Position | None:
    """Runs `Backup.restore` on every worker, or on none; every worker calls it.

    A worker without a ``backup_dir`` while others have one would skip the
    collectives of the restore and hang or mismatch them with its first
    training step, so that is an error on every worker.

    Raises:
        ValueError: If some workers have a ``backup_dir`` and others not, or
            they do not share it.
    """
    agree_on_backup_dir(backup.backup_dir if backup is not None else None, sync)
    return backup.restore(sync) if backup is not None else None
