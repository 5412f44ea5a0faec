"""Which Keras callbacks ``Trainer.fit`` runs as they are, maps onto its own options, or refuses.

Run once per ``fit``, before anything is built, so that a callback the
Trainer cannot honour gets one clear error instead of being ignored:

* ``keras.callbacks.BackupAndRestore`` and ``tfdist.callbacks.BackupAndRestore``
  become this fit's ``tfdist.BackupOptions`` (step-exact, chief-written
  backups); the callback itself is not run. Next to ``Trainer(backup=...)``,
  or next to each other, they are an error.
* ``ReduceLROnPlateau`` and ``LearningRateScheduler`` set the optimizer's
  learning rate, which under ``lr_scaling``/``warmup_*`` is a schedule: an
  error names both (Keras itself refuses to set a schedule's rate).
* ``OrbaxCheckpoint`` (JAX multi-host checkpoints) is refused, pointing to
  ``ModelCheckpoint`` and ``BackupOptions``.

Every other callback (the rest of ``keras.callbacks`` and the user's own) runs
as in ``model.fit``; `tfdist.training.fit.chief_only` keeps non-chief outputs
out of the way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from tfdist.config import invalid_argument
from tfdist.training.fit.chief_only import BackupAndRestore as TfdistBackupAndRestore
from tfdist.training.options import BackupOptions, LRScaling

# Callbacks that assign ``model.optimizer.learning_rate``.
_SETS_LEARNING_RATE = (keras.callbacks.ReduceLROnPlateau, keras.callbacks.LearningRateScheduler)
# What a Keras BackupAndRestore leaves in its backup_dir (the Trainer's backups are other files).
_KERAS_BACKUP_FILES = ("latest.weights.h5", "training_metadata.json")


@dataclasses.dataclass(frozen=True)
class FitCallbacks:
    """The callbacks one ``fit`` runs, and the backup a backup callback asked for.

    Attributes:
        callbacks: The callbacks to run (backup callbacks taken out).
        backup: ``BackupOptions`` from a backup callback, or None (then the
            Trainer's own ``backup``, if any, is used).
    """

    callbacks: tuple[keras.callbacks.Callback, ...]
    backup: BackupOptions | None = None


def resolve_callbacks(
    callbacks: Sequence[keras.callbacks.Callback],
    *,
    backup: BackupOptions | None,
    lr_scaling: LRScaling | None,
    accumulation_steps: int,
) -> FitCallbacks:
    """Checks ``fit``'s callbacks against the Trainer's options; maps backup callbacks.

    Args:
        callbacks: ``fit``'s callbacks, already checked to be Keras callbacks.
        backup: The Trainer's ``BackupOptions``, or None.
        lr_scaling: The Trainer's ``LRScaling``, or None.
        accumulation_steps: Micro-batches per optimizer update (Keras's
            ``save_freq`` counts batches, ``BackupOptions.freq`` updates).

    Returns:
        The callbacks to run and this fit's backup options.

    Raises:
        ValueError: For a callback the Trainer refuses, with what to use instead.
    """
    _refuse_orbax(callbacks)
    _refuse_learning_rate_setters(callbacks, lr_scaling)
    backups = [c for c in callbacks if _is_backup_callback(c)]
    if not backups:
        return FitCallbacks(tuple(callbacks))
    names = [type(c).__name__ for c in backups]
    if len(backups) > 1:
        raise invalid_argument("callbacks", names, "at most one BackupAndRestore")
    if backup is not None:
        raise invalid_argument(
            "callbacks",
            names,
            "no BackupAndRestore when the Trainer has `backup` "
            f"(Trainer(backup=BackupOptions({str(backup.dir)!r}, ...)))",
            note="Keep one of the two: the Trainer's backup already saves and resumes this fit.",
        )
    options = _backup_options(backups[0], accumulation_steps)
    return FitCallbacks(tuple(c for c in callbacks if c is not backups[0]), options)


def _is_backup_callback(callback: Any) -> bool:
    return isinstance(callback, (keras.callbacks.BackupAndRestore, TfdistBackupAndRestore))


def _refuse_orbax(callbacks: Sequence[keras.callbacks.Callback]) -> None:
    orbax = getattr(keras.callbacks, "OrbaxCheckpoint", None)
    if orbax is not None and any(isinstance(c, orbax) for c in callbacks):
        raise invalid_argument(
            "callbacks",
            "OrbaxCheckpoint",
            "callbacks that tfdist.Trainer supports",
            note="OrbaxCheckpoint coordinates JAX hosts, not tf.distribute workers. Use "
            "keras.callbacks.ModelCheckpoint (written by the chief only) for checkpoints, or "
            "Trainer(backup=tfdist.BackupOptions(dir, freq=...)) to resume after a failure.",
        )


def _refuse_learning_rate_setters(
    callbacks: Sequence[keras.callbacks.Callback], lr_scaling: LRScaling | None
) -> None:
    setters = [type(c).__name__ for c in callbacks if isinstance(c, _SETS_LEARNING_RATE)]
    if not setters or lr_scaling is None or not lr_scaling.active:
        return
    raise invalid_argument(
        "callbacks",
        setters,
        "no callback that sets the learning rate while the Trainer scales or warms it up "
        f"(lr_scaling={lr_scaling.rule!r}, warmup_steps={lr_scaling.warmup_steps!r}, "
        f"warmup_epochs={lr_scaling.warmup_epochs!r})",
        note="With lr_scaling or warmup_steps/warmup_epochs the optimizer's learning rate is a "
        "schedule (ScaledWarmup, in tfdist.training.build.lr_schedules), and Keras cannot set "
        "a schedule's rate. Drop the scaling/warmup and let the callback set the rate, or drop "
        "the callback and give the optimizer a keras.optimizers.schedules.LearningRateSchedule, "
        "which the Trainer then scales.",
    )


def _backup_options(callback: keras.callbacks.Callback, accumulation_steps: int) -> BackupOptions:
    """``BackupOptions`` for a Keras or tfdist ``BackupAndRestore``."""
    if isinstance(callback, TfdistBackupAndRestore):
        # Its save_freq counts train_function calls of plain fit; here, optimizer updates.
        return BackupOptions(
            callback.backup_dir,
            freq=callback.save_freq,
            keep_last=callback.keep_backups,
            keep_after_success=bool(callback.keep_backup),
        )
    freq = callback.save_freq
    if isinstance(freq, bool) or (freq != "epoch" and not isinstance(freq, int)) or freq == 0:
        raise invalid_argument(
            "BackupAndRestore.save_freq", freq, "'epoch' or a positive number of batches"
        )
    if freq != "epoch":
        if freq % accumulation_steps:
            raise invalid_argument(
                "BackupAndRestore.save_freq",
                freq,
                f"a multiple of accumulation_steps={accumulation_steps}",
                note="The Trainer backs up between optimizer updates, each of "
                f"{accumulation_steps} batches.",
            )
        freq //= accumulation_steps
    _refuse_keras_backup_files(str(callback.backup_dir))
    return BackupOptions(
        callback.backup_dir,
        freq=freq,
        keep_last=2 if callback.double_checkpoint else 1,
        keep_after_success=not callback.delete_checkpoint,
    )


def _refuse_keras_backup_files(backup_dir: str) -> None:
    """A backup that plain Keras ``fit`` wrote must not be silently trained over from scratch."""
    found = [f for f in _KERAS_BACKUP_FILES if tf.io.gfile.exists(f"{backup_dir}/{f}")]
    if found:
        raise invalid_argument(
            "BackupAndRestore.backup_dir",
            backup_dir,
            "a directory without a backup written by plain keras Model.fit",
            note=f"It holds {', '.join(found)}, which tfdist.Trainer cannot resume from (its "
            "backups are step-exact tfdist checkpoints). Finish that run with model.fit, or "
            "give the Trainer another directory.",
        )
