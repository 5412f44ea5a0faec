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

import tensorflow as tf

logger = logging.getLogger(__name__)

STATE_FILE = "state.json"
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


class Backup:
    """Saves and restores one run's backups in ``backup_dir``.

    Args:
        backup_dir: The directory (local or any ``tf.io.gfile`` filesystem).
        checkpoint: What to save, e.g. ``tf.train.Checkpoint(model=..., optimizer=...)``.
        is_chief: Whether this process writes ``backup_dir``.
        task_label: ``task_type:task_id`` for temporary names and logs.
        max_to_keep: Checkpoints kept; older ones are deleted after a commit.
    """

    def __init__(self, backup_dir: str, checkpoint: tf.train.Checkpoint, *, is_chief: bool,
                 task_label: str = "chief:0", max_to_keep: int = 2) -> None:
        self.backup_dir = backup_dir
        self.checkpoint = checkpoint
        self.is_chief = is_chief
        self.task_label = task_label
        self.max_to_keep = max_to_keep
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

    def restore(self) -> Position | None:
        """Loads the last committed backup into the tracked objects.

        Returns:
            Where to resume, or None when ``backup_dir`` holds no backup.
        """
        state = self.read_state()
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
                self._commit({"number": number, "checkpoint": name, **dataclasses.asdict(position)})
                self._delete_older_than(number - self.max_to_keep + 1)
        finally:
            if not self.is_chief:
                tf.io.gfile.rmtree(target)
        logger.debug("%s saved backup %s at %s", self.task_label, name, position)

    def _commit(self, state: dict[str, Any]) -> None:
        tmp = self._state_path() + f".tmp-{os.getpid()}"
        with tf.io.gfile.GFile(tmp, "w") as f:
            json.dump(state, f)
        tf.io.gfile.rename(tmp, self._state_path(), overwrite=True)

    def _delete_older_than(self, keep_from: int) -> None:
        for path in tf.io.gfile.glob(os.path.join(self.backup_dir, "ckpt-*")):
            number = os.path.basename(path).split(".")[0].split("-")[1]
            if number.isdigit() and int(number) < keep_from:
                tf.io.gfile.remove(path)

    def remove(self) -> None:
        """Deletes the backup after a successful run (chief only)."""
        if self.is_chief and tf.io.gfile.exists(self.backup_dir):
            for path in tf.io.gfile.glob(os.path.join(self.backup_dir, "ckpt-*")) + [self._state_path()]:
                tf.io.gfile.remove(path)
            if not tf.io.gfile.listdir(self.backup_dir):
                tf.io.gfile.rmtree(self.backup_dir)

    def _test_hook(self) -> None:
        spec = os.environ.get(_TEST_HOOK, "")
        if spec.startswith("kill_before_commit:") and self._saves == int(spec.split(":")[1]):
            logger.warning("Test hook: SIGKILL between the checkpoint write and its commit")
            os.kill(os.getpid(), signal.SIGKILL)


class PreemptionWatcher:
    """Notes SIGTERM so the loop can save at the next step boundary and exit for a restart."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def __enter__(self) -> "PreemptionWatcher":
        import threading

        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_signal)
        return self

    def _on_signal(self, signum: int, frame: Any) -> None:
        logger.warning("SIGTERM: saving a backup at the next step boundary, then exiting for a restart")
        self.requested = True

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
