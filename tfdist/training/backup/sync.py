"""Every worker resumes at the chief's backup: the `Position`, and how workers agree on it.

Only the chief writes ``backup_dir`` (`tfdist.training.backup.writer`), but
every worker restores from it, so with several workers it must be storage
they all share. `chief_state` checks this and hands every worker the
chief's committed state: the chief leaves a probe file that every other
worker must see, and broadcasts the checkpoint number and position it read.
A worker that does not see the probe or the checkpoint makes every worker
raise the same error, instead of training from different states or hanging.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
from collections.abc import Sequence
from typing import Any, Protocol

import tensorflow as tf

from tfdist.config import invalid_argument
from tfdist.training.backup.files import PROBE_PREFIX, checkpoint_name

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Position:
    """Where training stood when a backup was taken.

    Attributes:
        epoch: The epoch in progress (or the next one, with ``step == 0``).
        step: Micro-batches of ``epoch`` already trained on.
        updates: Optimizer updates applied in total.
        replicas: ``num_replicas_in_sync`` of the run that wrote the backup (0: not
            recorded, a backup of an older tfdist). Only for the log of a resume on
            another world size: ``step`` and ``updates`` count global batches and
            updates, which do not depend on it.
    """

    epoch: int
    step: int
    updates: int
    replicas: int = 0


class Sync(Protocol):
    """What a restore needs from a runner to make workers agree."""

    def broadcast(self, values: Sequence[int]) -> list[int]: ...

    def agree(self, flag: bool) -> bool: ...


def chief_state(
    backup_dir: str, state: dict[str, Any] | None, *, sync: Sync, is_chief: bool, task_label: str
) -> dict[str, Any] | None:
    """The chief's committed backup state, the same on every worker; every worker calls it.

    Args:
        backup_dir: The backup directory.
        state: The ``state.json`` this worker read, or None.
        sync: The runner's collectives.
        is_chief: Whether this process is the chief.
        task_label: ``task_type:task_id``, for the probe file and messages.

    Returns:
        The chief's state (checkpoint name and position), or None when the
        chief has no backup: every worker then starts afresh.

    Raises:
        ValueError: If the workers do not see the same ``backup_dir``.
    """
    probe = ""
    if is_chief:
        tf.io.gfile.makedirs(backup_dir)
        probe = f"{PROBE_PREFIX}{secrets.randbits(48) | 1}"
        with tf.io.gfile.GFile(os.path.join(backup_dir, probe), "w") as f:
            f.write(task_label)
    try:
        # The position travels too: a backup of a tfdist that kept it in
        # state.json only has none in its checkpoint (see Backup.restore).
        keys = ("number", "epoch", "step", "updates")
        chief_read = [state[k] for k in keys] if state else [0] * len(keys)
        fields = [int(probe[len(PROBE_PREFIX) :] or 0)] + chief_read
        nonce, number, epoch, step, updates = sync.broadcast(fields)
        problem = None if is_chief else _mismatch(backup_dir, task_label, nonce, number)
        if sync.agree(problem is not None):
            raise _not_shared_error(backup_dir, number, problem)
    finally:
        if probe:
            tf.io.gfile.remove(os.path.join(backup_dir, probe))
    if number == 0:
        if state is not None:
            logger.warning(
                "%s sees a backup in %s but the chief does not: starting afresh as the chief does.",
                task_label,
                backup_dir,
            )
        return None
    return {"checkpoint": checkpoint_name(number), "epoch": epoch, "step": step, "updates": updates}


def _mismatch(backup_dir: str, task_label: str, nonce: int, number: int) -> str | None:
    """Why this worker cannot use the chief's backup, or None."""
    if not tf.io.gfile.exists(os.path.join(backup_dir, f"{PROBE_PREFIX}{nonce}")):
        return f"{task_label} does not see the file the chief has just written there"
    name = checkpoint_name(number)
    if number and not tf.io.gfile.exists(os.path.join(backup_dir, f"{name}.index")):
        return f"{task_label} does not see the chief's checkpoint {name} there"
    return None


def _not_shared_error(backup_dir: str, number: int, problem: str | None) -> ValueError:
    what = f"checkpoint {checkpoint_name(number)}" if number else "no backup (a fresh start)"
    seen = problem or "another worker does not see the chief's files there (see its error)"
    return invalid_argument(
        "backup_dir",
        backup_dir,
        "a directory on storage that every worker shares",
        note=f"The chief found {what}, but {seen}. Every worker restores the chief's backup, "
        "so backup_dir must be the same shared filesystem or bucket (NFS, GCS, HDFS, ...) "
        "on every worker, not a local disk of each machine.",
    )


def agree_on_backup_dir(backup_dir: str | None, sync: Sync) -> None:
    """Raises on every worker if some have a ``backup_dir`` (not None) and others none.

    A worker without one would skip the collectives of the restore and hang or
    mismatch them with its first training step.
    """
    some_without, some_with = sync.agree(backup_dir is None), sync.agree(backup_dir is not None)
    if some_without and some_with:
        raise invalid_argument(
            "backup_dir",
            backup_dir,
            "the same shared backup_dir on every worker",
            note="Some workers were given a backup_dir and others none. Every worker restores the "
            "chief's backup (only the chief writes it), so pass the same backup_dir to every "
            "worker.",
        )
