"""Step-exact, atomic backups: the state a restarted run needs to resume at the same update.

A backup is a ``tf.train.Checkpoint`` of the model, the optimizer (its slots,
``iterations`` and, under fp16, the loss scale) and tfdist's own counters,
plus ``state.json``: which checkpoint is current and where training stood
(epoch, micro-batches done in it, optimizer updates).

Writes are atomic: the checkpoint files of save ``N`` are written first, and
only then does ``state.json`` move to point at them (write to a temporary
file, then rename). A process killed at any moment leaves the previous backup
loadable. Only the chief writes ``backup_dir``; other workers take part in the
save (it may read variables through collectives) into a private temporary
directory that is removed straight away.

``backup_dir`` may be any ``tf.io.gfile`` path. How safe the commit is depends
on the filesystem:

* local POSIX filesystems: the checkpoint files and the new ``state.json`` are
  fsynced, then renamed, then the directory is fsynced, so the commit is atomic
  and survives a power loss as well as a kill;
* HDFS: the rename is atomic, but there is no fsync;
* object stores (``gs://``, ``s3://``): a "rename" is a copy and a delete. One
  object is replaced whole, so a reader sees the old or the new ``state.json``,
  never a torn one; a kill between the copy and the delete leaves a
  ``state.json.tmp-*`` that is ignored and removed by the next cleanup;
* NFS and other network filesystems: the rename is atomic on the server, but
  other clients may read a cached ``state.json`` for a while.

Every worker of a multi-worker run reads the backup, so ``backup_dir`` must be
storage they all share; :meth:`Backup.restore` checks this and makes every
worker resume at the chief's position.

Security: restoring reads the weight files in ``backup_dir``; point it only at
a directory you trust.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import secrets
import signal
import tempfile
from typing import Any, Protocol, Sequence

import tensorflow as tf

logger = logging.getLogger(__name__)

STATE_FILE = "state.json"
TMP_SUFFIX = ".tmp-"  # state.json.tmp-PID: a commit in progress (or killed)
PROBE_PREFIX = ".tfdist-probe-"  # written by the chief at restore, to check that backup_dir is shared
_TEST_HOOK = "TFDIST_BACKUP_TEST_HOOK"  # "kill_before_commit:N" SIGKILLs the N-th save before its commit


def check_frequency(name: str, value: Any, unit: str) -> Any:
    """Validates a backup frequency: ``"epoch"`` or a positive int of ``unit``."""
    from tfdist.config import invalid_argument

    if value == "epoch" or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        return value
    raise invalid_argument(name, value, f"'epoch' or a positive number of {unit}")


def checkpoint_for(model: Any, optimizer: Any, **extra: Any) -> tf.train.Checkpoint:
    """A checkpoint of the TF variables behind a Keras model and optimizer.

    Tracks the model's variables (RNG seed states included), the optimizer's
    (slots, ``iterations``, the loss scale) and ``extra``. TF saves and
    restores these on every strategy, ``ShardedVariable`` included, which the
    Keras objects themselves do not.
    """
    def tf_variables(variables):
        return [getattr(v, "_value", v) for v in variables]

    return tf.train.Checkpoint(model=tf_variables(model.variables), optimizer=tf_variables(optimizer.variables),
                               **extra)


@dataclasses.dataclass(frozen=True)
class Position:
    """Where training stood when a backup was taken.

    Attributes:
        epoch: The epoch in progress (or the next one, with ``step == 0``).
        step: Micro-batches of ``epoch`` already trained on.
        updates: Optimizer updates applied in total.
    """

    epoch: int
    step: int
    updates: int


class Sync(Protocol):
    """What :meth:`Backup.restore` needs from a runner to make workers agree."""

    def broadcast(self, values: Sequence[int]) -> list[int]: ...

    def agree(self, flag: bool) -> bool: ...


def _is_local(path: str) -> bool:
    return not re.match(r"^[A-Za-z][\w+.-]*://", path) or path.startswith("file://")


def _fsync(path: str) -> None:
    """Flushes a local file or directory to disk (a directory: its entries, e.g. a rename)."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if os.path.isdir(path) else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_CKPT_RE = re.compile(r"^ckpt-(\d+)(?:[._]|$)")  # ckpt-N.index, ckpt-N.data-*, ckpt-N_temp (a killed write)


class Backup:
    """Saves and restores one run's backups in ``backup_dir``.

    Args:
        backup_dir: The directory (local or any ``tf.io.gfile`` filesystem).
        checkpoint: What to save, e.g. ``tf.train.Checkpoint(model=..., optimizer=...)``.
        is_chief: Whether this process writes ``backup_dir``.
        task_label: ``task_type:task_id`` for temporary names and logs.
        keep_backups: How many of the newest backups ``backup_dir`` holds; the
            older ones are deleted once a newer one is committed.
    """

    def __init__(self, backup_dir: str, checkpoint: tf.train.Checkpoint, *, is_chief: bool,
                 task_label: str = "chief:0", keep_backups: int = 1) -> None:
        self.backup_dir = backup_dir
        self.checkpoint = checkpoint
        self.is_chief = is_chief
        self.task_label = task_label
        self.keep_backups = keep_backups
        self._saves = 0

    def _state_path(self) -> str:
        return os.path.join(self.backup_dir, STATE_FILE)

    def read_state(self) -> dict[str, Any] | None:
        """The committed state, or None when there is no backup yet.

        Raises:
            ValueError: If ``state.json`` is not a backup's state (e.g. another tool's file).
        """
        from tfdist.config import invalid_argument

        path = self._state_path()
        if not tf.io.gfile.exists(path):
            return None
        with tf.io.gfile.GFile(path) as f:
            try:
                state = json.load(f)
            except ValueError as e:
                state = str(e)
        keys = ("number", "checkpoint", "epoch", "step", "updates")
        if not isinstance(state, dict) or not all(k in state for k in keys):
            raise invalid_argument("backup_dir", self.backup_dir, "a directory holding a tfdist backup, or none",
                                   note=f"Its {STATE_FILE} is not a backup's state ({state!r:.80}); "
                                        "remove it to start afresh.")
        return state

    def restore(self, sync: Sync | None = None) -> Position | None:
        """Loads the last committed backup into the tracked objects; every worker calls it.

        With ``sync`` (the runner), the chief's backup wins: every worker
        restores the checkpoint and position the chief read. The chief leaves a
        probe file that every other worker must see in its ``backup_dir``; if
        one does not (``backup_dir`` is not shared storage) or lacks the
        chief's checkpoint, every worker raises the same error instead of
        training from different states or hanging.

        Returns:
            Where to resume, or None when ``backup_dir`` holds no backup.

        Raises:
            ValueError: If the workers do not see the same ``backup_dir``.
        """
        state = self.read_state()
        if sync is None:
            return self._load(state)
        probe = ""
        if self.is_chief:
            tf.io.gfile.makedirs(self.backup_dir)
            probe = f"{PROBE_PREFIX}{secrets.randbits(48) | 1}"
            with tf.io.gfile.GFile(os.path.join(self.backup_dir, probe), "w") as f:
                f.write(self.task_label)
        try:
            fields = [int(probe[len(PROBE_PREFIX):] or 0)] + (
                [state["number"], state["epoch"], state["step"], state["updates"]] if state else [0, 0, 0, 0])
            nonce, number, epoch, step, updates = sync.broadcast(fields)
            problem = None if self.is_chief else self._mismatch(nonce, number)
            if sync.agree(problem is not None):
                raise self._not_shared_error(number, problem)
        finally:
            if probe:
                tf.io.gfile.remove(os.path.join(self.backup_dir, probe))
        if number == 0:
            if state is not None:
                logger.warning("%s sees a backup in %s but the chief does not: starting afresh as the chief does.",
                               self.task_label, self.backup_dir)
            return None
        chief_state = {"checkpoint": f"ckpt-{number}", "epoch": epoch, "step": step, "updates": updates}
        return self._load(chief_state)

    def _mismatch(self, nonce: int, number: int) -> str | None:
        """Why this worker cannot use the chief's backup, or None."""
        if not tf.io.gfile.exists(os.path.join(self.backup_dir, f"{PROBE_PREFIX}{nonce}")):
            return f"{self.task_label} does not see the file the chief has just written there"
        if number and not tf.io.gfile.exists(os.path.join(self.backup_dir, f"ckpt-{number}.index")):
            return f"{self.task_label} does not see the chief's checkpoint ckpt-{number} there"
        return None

    def _not_shared_error(self, number: int, problem: str | None) -> ValueError:
        from tfdist.config import invalid_argument

        what = f"checkpoint ckpt-{number}" if number else "no backup (a fresh start)"
        seen = problem or "another worker does not see the chief's files there (see its error)"
        return invalid_argument(
            "backup_dir", self.backup_dir, "a directory on storage that every worker shares",
            note=f"The chief found {what}, but {seen}. Every worker restores the chief's backup, so "
                 "backup_dir must be the same shared filesystem or bucket (NFS, GCS, HDFS, ...) on every "
                 "worker, not a local disk of each machine.")

    def _load(self, state: dict[str, Any] | None) -> Position | None:
        if state is None:
            return None
        prefix = os.path.join(self.backup_dir, state["checkpoint"])
        self.checkpoint.read(prefix).assert_existing_objects_matched()
        position = Position(state["epoch"], state["step"], state["updates"])
        logger.info("Restored backup %s: resuming at epoch %d, micro-batch %d (%d updates done)",
                    prefix, position.epoch + 1, position.step, position.updates)
        return position

    def save(self, position: Position) -> None:
        """Writes a backup of the current state at ``position``; every worker calls it."""
        self._saves += 1
        state = self.read_state() if self.is_chief else None
        number = (state["number"] + 1) if state else 1
        name = f"ckpt-{number}"
        target = self.backup_dir if self.is_chief else tempfile.mkdtemp(
            prefix=f"tfdist-backup-{self.task_label.replace(':', '-')}-")
        if self.is_chief:
            tf.io.gfile.makedirs(self.backup_dir)
        try:
            self.checkpoint.write(os.path.join(target, name))
            self._test_hook()
            if self.is_chief:
                entry = {"checkpoint": name, **dataclasses.asdict(position)}
                kept = ((state or {}).get("kept", []) + [entry])[-self.keep_backups:]
                self._commit({"number": number, **entry, "kept": kept})
                self._delete_other_checkpoints(keep=range(number - self.keep_backups + 1, number + 1))
        finally:
            if not self.is_chief:
                tf.io.gfile.rmtree(target)
        logger.debug("%s saved backup %s at %s", self.task_label, name, position)

    def _commit(self, state: dict[str, Any]) -> None:
        """Points ``state.json`` at a written checkpoint: the one step that makes a save count."""
        path = self._state_path()
        tmp = path + f"{TMP_SUFFIX}{os.getpid()}"
        if not _is_local(self.backup_dir):
            with tf.io.gfile.GFile(tmp, "w") as f:
                json.dump(state, f)
            tf.io.gfile.rename(tmp, path, overwrite=True)
            return
        local_dir = self.backup_dir[len("file://"):] if self.backup_dir.startswith("file://") else self.backup_dir
        path, tmp = os.path.join(local_dir, STATE_FILE), os.path.join(local_dir, os.path.basename(tmp))
        # The checkpoint's bytes must be on disk before state.json names it,
        # else a power loss could leave a committed but torn checkpoint.
        for name in tf.io.gfile.glob(os.path.join(local_dir, state["checkpoint"] + ".*")):
            _fsync(name)
        with open(tmp, "w") as f:
            json.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        _fsync(local_dir)
        os.replace(tmp, path)
        _fsync(local_dir)  # makes the rename itself durable

    def _delete_other_checkpoints(self, keep: range) -> None:
        """Deletes checkpoint files and leftovers of killed writes whose number is not in ``keep``."""
        for path in tf.io.gfile.glob(os.path.join(self.backup_dir, "ckpt-*")):
            match = _CKPT_RE.match(os.path.basename(path))
            if match and (int(match.group(1)) not in keep or path.rstrip("/").endswith("_temp")):
                _delete(path)

    def remove(self) -> None:
        """Deletes the backup after a successful run (chief only).

        Removes every file tfdist put in ``backup_dir`` (leftovers of killed
        writes included), then the directory itself if nothing else is in it.
        """
        if not (self.is_chief and tf.io.gfile.exists(self.backup_dir)):
            return
        patterns = ("ckpt-*", STATE_FILE, STATE_FILE + TMP_SUFFIX + "*", PROBE_PREFIX + "*")
        for pattern in patterns:
            for path in tf.io.gfile.glob(os.path.join(self.backup_dir, pattern)):
                _delete(path)
        if not tf.io.gfile.listdir(self.backup_dir):
            tf.io.gfile.rmtree(self.backup_dir)

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
    from tfdist.config import invalid_argument

    some_without, some_with = sync.agree(backup is None), sync.agree(backup is not None)
    if some_without and some_with:
        raise invalid_argument(
            "backup_dir", backup.backup_dir if backup is not None else None,
            "the same shared backup_dir on every worker",
            note="Some workers were given a backup_dir and others none. Every worker restores the "
                 "chief's backup (only the chief writes it), so pass the same backup_dir to every worker.")
    return backup.restore(sync) if backup is not None else None


def _delete(path: str) -> None:
    if tf.io.gfile.isdir(path):
        tf.io.gfile.rmtree(path)
    else:
        tf.io.gfile.remove(path)
