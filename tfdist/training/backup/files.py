"""The files of a backup directory: the atomic commit of ``state.json``, reading it, and cleanup.

Layout of ``backup_dir``:

* ``ckpt-N.index``, ``ckpt-N.data-*``: backup ``N``, a ``tf.train.Checkpoint``
  of the model, the optimizer, tfdist's counters *and* the position (epoch,
  micro-batch, updates), so the weights and where they stand are one set of
  files;
* ``state.json``: the commit record. It names the current checkpoint
  (``number``, ``checkpoint``), repeats its position (``epoch``, ``step``,
  ``updates``) for readers that do not open TF checkpoints (``RayBackup``,
  people), and lists the kept backups (``kept``);
* leftovers of killed writes: ``ckpt-N_temp/`` (TF's shards of an unfinished
  write), ``ckpt-N.*`` that no ``state.json`` names, ``state.json.tmp-PID``.
  The next save and the removal after a successful run delete them;
* ``.tfdist-probe-*``: written by the chief during a restore to check that
  every worker sees the same directory, and removed straight away.

A save counts once ``state.json`` names it: the checkpoint files are written
first, then a new ``state.json`` replaces the old one by a rename. How safe
that is depends on the filesystem:

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

Why not ``tf.train.CheckpointManager``: its ``save()`` writes the checkpoint
and then, inside the same call, renames its ``checkpoint`` index into place
without an fsync of the index or the directory, so a power loss can leave an
empty or torn index on filesystems that do not order data before a rename
(XFS, ext4 with ``noauto_da_alloc``); an index that does not parse (torn, or
another tool's) it reads as "no checkpoint", a warning and then a fresh start,
where tfdist stops with a clear error;
it deletes only the checkpoints it recorded, not the leftovers above; and its
text-proto index cannot hold the kept positions that tools without TF read.
The numbering and the keep-N sweep it would give are the few lines below.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import signal
import time
from typing import Any

import tensorflow as tf

logger = logging.getLogger(__name__)

STATE_FILE = "state.json"
TMP_SUFFIX = ".tmp-"  # state.json.tmp-PID: a commit in progress (or killed)
PROBE_PREFIX = ".tfdist-probe-"  # the chief writes one at restore: is backup_dir shared?
STATE_KEYS = ("number", "checkpoint", "epoch", "step", "updates")
# ckpt-N.index, ckpt-N.data-*, ckpt-N_temp (the shards of a killed write)
_CKPT_RE = re.compile(r"^ckpt-(\d+)(?:[._]|$)")
#: Bench and test hook, not a setting: each `fsync` first sleeps this many milliseconds,
#: a slow disk (``tfdist bench --benchmarks=backup --slow_fsync_ms=30`` sets it).
SLOW_FSYNC_ENV = "TFDIST_BACKUP_SLOW_FSYNC_MS"


def checkpoint_name(number: int) -> str:
    """The file prefix of backup ``number``: ``ckpt-N``."""
    return f"ckpt-{number}"


def is_local(path: str) -> bool:
    """Whether ``path`` is on the local filesystem (no ``scheme://``, or ``file://``)."""
    return not re.match(r"^[A-Za-z][\w+.-]*://", path) or path.startswith("file://")


def fsync(path: str) -> None:
    """Flushes a local file or directory to disk (a directory: its entries, e.g. a rename)."""
    _slow_disk()
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if os.path.isdir(path) else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _slow_disk() -> None:
    """Sleeps ``$TFDIST_BACKUP_SLOW_FSYNC_MS`` milliseconds, if set: a bench and test hook."""
    slow_ms = float(os.environ.get(SLOW_FSYNC_ENV) or 0)
    if slow_ms > 0:
        time.sleep(slow_ms / 1000)


def read_state(backup_dir: str) -> dict[str, Any] | None:
    """The committed ``state.json`` of ``backup_dir``, or None when there is no backup yet.

    Raises:
        ValueError: If ``state.json`` is not a backup's state (e.g. another tool's file).
    """
    from tfdist.config import invalid_argument

    path = os.path.join(backup_dir, STATE_FILE)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as f:
        try:
            state = json.load(f)
        except ValueError as e:
            state = str(e)
    if not isinstance(state, dict) or not all(k in state for k in STATE_KEYS):
        raise invalid_argument(
            "backup_dir",
            backup_dir,
            "a directory holding a tfdist backup, or none",
            note=f"Its {STATE_FILE} is not a backup's state ({state!r:.80}); "
            "remove it to start afresh.",
        )
    return state


def commit_state(backup_dir: str, state: dict[str, Any]) -> None:
    """Points ``state.json`` at a written checkpoint: the one step that makes a save count."""
    path = os.path.join(backup_dir, STATE_FILE)
    tmp = path + f"{TMP_SUFFIX}{os.getpid()}"
    if not is_local(backup_dir):
        with tf.io.gfile.GFile(tmp, "w") as f:
            json.dump(state, f)
        tf.io.gfile.rename(tmp, path, overwrite=True)
        return
    local_dir = backup_dir[len("file://") :] if backup_dir.startswith("file://") else backup_dir
    path, tmp = os.path.join(local_dir, STATE_FILE), os.path.join(local_dir, os.path.basename(tmp))
    # The checkpoint's bytes must be on disk before state.json names it,
    # else a power loss could leave a committed but torn checkpoint.
    for name in tf.io.gfile.glob(os.path.join(local_dir, state["checkpoint"] + ".*")):
        fsync(name)
    with open(tmp, "w") as f:
        json.dump(state, f)
        f.flush()
        _slow_disk()
        os.fsync(f.fileno())
    fsync(local_dir)
    os.replace(tmp, path)
    fsync(local_dir)  # makes the rename itself durable


@dataclasses.dataclass(frozen=True)
class Commit:
    """The commit of one written checkpoint: the write's callback (TF's writer thread if async).

    The chief's points ``state.json`` at the checkpoint (`commit_state`)
    and deletes the checkpoints not in ``keep``; another worker's (``state``
    None) removes its temporary directory ``temp_dir``. ``kill`` is the
    ``kill_before_commit`` test hook: SIGKILL before committing.
    """

    backup_dir: str
    name: str
    state: dict[str, Any] | None
    keep: range
    temp_dir: str | None
    kill: bool
    label: str
    position: Any  # the backup_sync.Position, for messages

    def __call__(self) -> None:  # no argument: TF passes the save path to one-argument callbacks
        if self.kill:
            logger.warning("Test hook: SIGKILL between the checkpoint write and its commit")
            os.kill(os.getpid(), signal.SIGKILL)
        if self.state is not None:
            commit_state(self.backup_dir, self.state)
            delete_other_checkpoints(self.backup_dir, keep=self.keep)
        self.remove_temp_dir()
        logger.debug("%s saved backup %s at %s", self.label, self.name, self.position)

    def remove_temp_dir(self) -> None:
        """Removes a non-chief's temporary directory, if it is still there."""
        if self.temp_dir is not None and tf.io.gfile.exists(self.temp_dir):
            tf.io.gfile.rmtree(self.temp_dir)


def delete_other_checkpoints(backup_dir: str, keep: range) -> None:
    """Deletes checkpoint files and leftovers of killed writes whose number is not in ``keep``."""
    for path in tf.io.gfile.glob(os.path.join(backup_dir, "ckpt-*")):
        match = _CKPT_RE.match(os.path.basename(path))
        if match and (int(match.group(1)) not in keep or path.rstrip("/").endswith("_temp")):
            _delete(path)


def remove_backup_files(backup_dir: str) -> None:
    """Deletes every file tfdist puts in ``backup_dir``, then the directory if it is empty."""
    if not tf.io.gfile.exists(backup_dir):
        return
    for pattern in ("ckpt-*", STATE_FILE, STATE_FILE + TMP_SUFFIX + "*", PROBE_PREFIX + "*"):
        for path in tf.io.gfile.glob(os.path.join(backup_dir, pattern)):
            _delete(path)
    if not tf.io.gfile.listdir(backup_dir):
        tf.io.gfile.rmtree(backup_dir)


def _delete(path: str) -> None:
    if tf.io.gfile.isdir(path):
        tf.io.gfile.rmtree(path)
    else:
        tf.io.gfile.remove(path)
