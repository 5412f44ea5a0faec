"""``RayBackup``: tfdist's step-exact backups as Ray Train checkpoints.

    def train():
        strategy = tfdist.make_strategy("multi_worker")
        backup = RayBackup("/shared/run/backup")  # restores ray.train.get_checkpoint() first
        trainer = tfdist.Trainer(
            build, strategy=strategy, ..., backup_dir=backup.backup_dir, backup_freq=50
        )
        trainer.fit(data, epochs=5, callbacks=[backup])  # reports each committed backup to Ray

    tfdist.launch.ray_launcher(train, num_workers=2, max_failures=2)

It uses only the public surface: the Trainer writes and restores
``backup_dir`` as always; this callback copies each committed backup into a
``ray.train.Checkpoint`` (chief only) reported with the latest metrics, and
on start copies Ray's latest checkpoint into ``backup_dir`` when that holds
no newer backup, before the Trainer restores it. A restarted group therefore
resumes at the last backed-up update: a failure costs at most ``backup_freq``
updates.

``ray.train.report`` is a barrier that every worker must call equally often,
so every worker reports at the same points, computed from the batch indices
all of them see: at the first batch after ``backup_freq`` more updates, at
each epoch start and at the end of training. Only the chief attaches a
checkpoint, and only when ``state.json`` names a backup it has not reported.
The Trainer commits backups in the background (``BackupOptions(asynchronous=True)``,
the default), so a report may carry the backup before the newest; the
last one is committed before ``on_train_end``, which reports it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
import time
from typing import Any

import keras

from tfdist.launch.ray.engine import require_ray
from tfdist.logs import as_floats

logger = logging.getLogger(__name__)
STATE_FILE = "state.json"  # tfdist.training.backup.writer.STATE_FILE, read here as a file format


def _read_state(directory: str) -> dict[str, Any] | None:
    path = os.path.join(directory, STATE_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


class RayBackup(keras.callbacks.Callback):
    """Reports a Trainer's backups to Ray Train, and restores Ray's checkpoint into ``backup_dir``.

    Create it in the Ray Train worker before the Trainer's ``fit`` (it
    restores on construction), pass ``backup_dir`` to the Trainer and the
    callback to ``fit``.

    Args:
        backup_dir: The Trainer's ``backup_dir``, a local path that every
            worker shares (one node, or a shared filesystem).
        backup_freq: The Trainer's ``backup_freq`` (report points follow it).
        accumulation_steps: The Trainer's ``accumulation_steps``.

    Attributes:
        restored: The ``state.json`` of the checkpoint copied from Ray, or None.
        restored_at: ``time.time()`` when that copy finished.
    """

    def __init__(
        self, backup_dir: str, *, backup_freq: int | str = "epoch", accumulation_steps: int = 1
    ) -> None:
        super().__init__()
        ray = require_ray()
        self.backup_dir = backup_dir
        self.backup_freq = backup_freq
        self.accumulation_steps = accumulation_steps
        self._context = ray.train.get_context()
        # Ray's world rank 0: a Ray concept, not TF's chief rule (tfdist.cluster.is_chief_task).
        # Ray's all-worker groups give rank r the TF task worker:r, so both name one process.
        self.is_chief = self._context.get_world_rank() == 0
        self.restored: dict[str, Any] | None = None
        self.restored_at: float | None = None
        self._reported = None  # the backup number last reported
        self._mark = 0  # backup_freq periods reported so far
        self._epoch = 0
        self._logs: dict[str, float] = {}
        if self.is_chief:
            self._restore()

    def _restore(self) -> None:
        """Copies Ray's latest checkpoint into ``backup_dir`` unless that is newer (chief only)."""
        import ray.train

        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            return
        with checkpoint.as_directory() as source:
            theirs, ours = _read_state(source), _read_state(self.backup_dir)
            if theirs is None:
                return
            if ours is not None and ours["updates"] >= theirs["updates"]:
                logger.info(
                    "backup_dir holds update %d, Ray's checkpoint %d: keeping backup_dir.",
                    ours["updates"],
                    theirs["updates"],
                )
                return
            os.makedirs(self.backup_dir, exist_ok=True)
            for name in os.listdir(source):
                if name.startswith(theirs["checkpoint"] + "."):
                    shutil.copy2(os.path.join(source, name), os.path.join(self.backup_dir, name))
            # state.json last, by rename (the Trainer's commit rule): a kill leaves no torn backup.
            tmp = os.path.join(self.backup_dir, f"{STATE_FILE}.tmp-{os.getpid()}")
            shutil.copy2(os.path.join(source, STATE_FILE), tmp)
            os.replace(tmp, os.path.join(self.backup_dir, STATE_FILE))
        self.restored, self.restored_at = theirs, time.time()
        self._reported = theirs["number"]
        logger.warning(
            "Restored Ray's checkpoint %s (update %d) into %s.",
            checkpoint.path,
            theirs["updates"],
            self.backup_dir,
        )

    def _updates_before(self, epoch: int, micro_batch: int) -> int:
        steps = self.params.get("steps") or 0
        per_epoch = math.ceil(steps / self.accumulation_steps)
        return epoch * per_epoch + micro_batch // self.accumulation_steps

    def _report(self) -> None:
        """Every worker calls it at the same points; the chief attaches a new backup, if any."""
        import ray.train

        metrics = {**as_floats(self._logs), "epoch": self._epoch}
        state = _read_state(self.backup_dir) if self.is_chief else None
        if state is None or state["number"] == self._reported:
            ray.train.report(metrics)
            return
        metrics["updates"] = state["updates"]
        with tempfile.TemporaryDirectory(prefix="tfdist-ray-ckpt-") as tmp:
            try:
                for name in os.listdir(self.backup_dir):
                    if name == STATE_FILE or name.startswith(state["checkpoint"] + "."):
                        shutil.copy2(os.path.join(self.backup_dir, name), os.path.join(tmp, name))
                copied = _read_state(tmp)["number"] == state["number"]
            except FileNotFoundError:  # its files deleted by a newer commit (in the background)
                copied = False
            if not copied:  # a save committed while copying: next time
                ray.train.report(metrics)
                return
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp))
        self._reported = state["number"]

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if epoch > self._epoch:  # the previous epoch's end backup, once committed
            self._epoch = epoch
            self._mark = (
                self._updates_before(epoch, 0) // self.backup_freq
                if isinstance(self.backup_freq, int)
                else 0
            )
            self._report()
        self._epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if not isinstance(self.backup_freq, int):
            return
        mark = self._updates_before(self._epoch, batch) // self.backup_freq
        if mark > self._mark:  # a step backup was taken since the last report
            self._mark = mark
            self._report()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self._logs.update(logs or {})

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self._logs.update(logs or {})

    def on_train_begin(self, logs: dict | None = None) -> None:
        if isinstance(self.backup_freq, int):
            self._mark = self._updates_before(self._epoch, 0) // self.backup_freq

    def on_train_end(self, logs: dict | None = None) -> None:
        self._epoch += 1
        self._report()  # the last epoch's backup, with the final metrics
