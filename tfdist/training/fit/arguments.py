"""The checks of ``Trainer.fit``'s loop arguments, and the ``steps_per_execution`` a fit uses.

Apart from `tfdist.training.fit.one_epoch`, which runs the epochs: these run once
per ``fit``, before anything is built or traced, so that a bad argument gets
one clear error naming it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import keras
import numpy as np

from tfdist.config import (
    check_fraction,
    check_non_negative_int,
    check_positive_int,
    invalid_argument,
)
from tfdist.strategies.base import Runner

logger = logging.getLogger(__name__)

_BATCH_HOOKS = ("on_batch_begin", "on_batch_end", "on_train_batch_begin", "on_train_batch_end")


def check_batch_size(batch_size: Any, global_batch_size: Any) -> int | None:
    """``batch_size`` (Keras's name) or ``global_batch_size`` (tfdist's): one value, both global.

    Raises:
        ValueError: If either is not a positive int or None, or both differ.
    """
    check_positive_int("batch_size", batch_size, allow_none=True)
    check_positive_int("global_batch_size", global_batch_size, allow_none=True)
    if batch_size is not None and global_batch_size is not None and batch_size != global_batch_size:
        raise invalid_argument(
            "batch_size",
            batch_size,
            f"None or global_batch_size's value ({global_batch_size})",
            note="batch_size and global_batch_size are the same thing, the examples of one step "
            "across all replicas: pass one of them.",
        )
    return global_batch_size if batch_size is None else batch_size


def check_verbose(verbose: Any) -> int:
    """``verbose`` as Keras takes it (``"auto"``, 0, 1, 2), as an int (``"auto"`` is 1)."""
    if verbose not in ("auto", 0, 1, 2) or isinstance(verbose, bool):
        raise invalid_argument("verbose", verbose, "'auto', 0, 1 or 2")
    return 1 if verbose == "auto" else int(verbose)


def check_callbacks(callbacks: Any) -> Sequence[keras.callbacks.Callback]:
    """``callbacks`` as a sequence of Keras callbacks (None: none)."""
    callbacks = () if callbacks is None else callbacks
    if isinstance(callbacks, (keras.callbacks.Callback, str)) or not all(
        isinstance(c, keras.callbacks.Callback) for c in callbacks
    ):
        note = ""
        if isinstance(callbacks, keras.callbacks.CallbackList):
            note = "Pass its callbacks as a list (callback_list.callbacks); the Trainer makes one."
        raise invalid_argument(
            "callbacks", callbacks, "a list of keras.callbacks.Callback", note=note
        )
    return callbacks


def _check_validation_freq(value: Any) -> int | tuple[int, ...]:
    """A positive int (every Nth epoch), or a list of 1-based epochs, as Keras takes it."""
    ok = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1  # noqa: E731
    if ok(value):
        return value
    if isinstance(value, (list, tuple)) and value and all(ok(v) for v in value):
        return tuple(value)
    raise invalid_argument(
        "validation_freq", value, "a positive integer, or a list of epochs (1-based)"
    )


def _check_class_weight(value: Any) -> dict[int, float] | None:
    """A dict of class index (a non-negative int) to weight (a number), or None."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or not value:
        raise invalid_argument("class_weight", value, "a non-empty dict {class index: weight}")
    for key, weight in value.items():
        if isinstance(key, bool) or not isinstance(key, (int, np.integer)) or key < 0:
            raise invalid_argument(
                "class_weight",
                value,
                "class indices (non-negative ints) as keys",
                note=f"Key {key!r} is not one.",
            )
        if isinstance(weight, bool) or not isinstance(weight, (int, float, np.number)):
            raise invalid_argument(
                "class_weight",
                value,
                "numbers as weights",
                note=f"Class {key}'s weight is {weight!r}.",
            )
    return {int(k): float(w) for k, w in value.items()}


@dataclasses.dataclass(frozen=True)
class FitArguments:
    """``Trainer.fit``'s non-data arguments, checked (``verbose`` an int, callbacks a sequence).

    ``global_batch_size`` is ``batch_size`` or ``global_batch_size``, whichever was given. The
    Trainer makes one of the arguments as passed, which `check_fit_arguments` checks.
    """

    epochs: int
    steps_per_epoch: int | None
    global_batch_size: int | None
    validation_steps: int | None
    initial_epoch: int
    verbose: int
    callbacks: Sequence[keras.callbacks.Callback]
    validation_split: float = 0.0
    validation_batch_size: int | None = None
    validation_freq: int | tuple[int, ...] = 1
    shuffle: bool | str = True
    class_weight: dict[int, float] | None = None

    def validates_after(self, epoch: int) -> bool:
        """Whether validation runs at the end of 0-based ``epoch`` (Keras's rule)."""
        if isinstance(self.validation_freq, int):
            return (epoch + 1) % self.validation_freq == 0
        return epoch + 1 in self.validation_freq


def check_fit_arguments(
    given: FitArguments,
    *,
    batch_size: Any,
    requires_steps_per_epoch: bool,
    sharding: str | None = None,
) -> FitArguments:
    """Checks ``Trainer.fit``'s arguments but its data (``x``, ``y``, ... are checked with it).

    Args:
        given: ``fit``'s arguments as passed, unchecked (``global_batch_size`` its keyword).
        batch_size: ``fit``'s ``batch_size`` (Keras's name for ``global_batch_size``).
        requires_steps_per_epoch: The runner's: ``steps_per_epoch`` must be given.
        sharding: The fit's sharding when it shards (``"parameters"``: callbacks that read or
            write the weights during fit are refused, `check_weight_callbacks`).

    Returns:
        ``given`` checked: ``verbose`` an int, callbacks a sequence, ``global_batch_size``
        whichever of the two was given.
    """
    check_positive_int("epochs", given.epochs)
    check_positive_int("steps_per_epoch", given.steps_per_epoch, allow_none=True)
    check_positive_int("validation_steps", given.validation_steps, allow_none=True)
    check_positive_int("validation_batch_size", given.validation_batch_size, allow_none=True)
    check_non_negative_int("initial_epoch", given.initial_epoch)
    global_batch_size = check_batch_size(batch_size, given.global_batch_size)
    check_fraction("validation_split", given.validation_split)
    if not isinstance(given.shuffle, bool) and given.shuffle != "batch":
        raise invalid_argument("shuffle", given.shuffle, "True, False or 'batch'")
    if given.steps_per_epoch is None and requires_steps_per_epoch:
        raise invalid_argument(
            "steps_per_epoch",
            None,
            "a positive integer under strategy 'parameter_server'",
            note="Its workers read their datasets independently and repeat them, so an epoch has "
            "no natural end: say how many batches make one.",
        )
    callbacks = check_callbacks(given.callbacks)
    if sharding == "parameters":
        check_weight_callbacks(callbacks)
    return dataclasses.replace(
        given,
        global_batch_size=global_batch_size,
        verbose=check_verbose(given.verbose),
        callbacks=callbacks,
        validation_split=float(given.validation_split),
        validation_freq=_check_validation_freq(given.validation_freq),
        class_weight=_check_class_weight(given.class_weight),
    )


def reads_weights(callback: keras.callbacks.Callback) -> bool:
    """Whether ``callback``, a Keras built-in, reads or writes the model's weights during fit
    (checkpoints, the best weights, EMA swaps, weight histograms and embeddings). Not the
    ``BackupAndRestore`` callbacks: they become the Trainer's backups, which save sharded
    parameters whole (`tfdist.training.fit.callback_mapping`)."""
    always = (keras.callbacks.ModelCheckpoint, keras.callbacks.SwapEMAWeights)
    if isinstance(callback, always):
        return True
    if isinstance(callback, keras.callbacks.EarlyStopping):
        return bool(callback.restore_best_weights)
    if isinstance(callback, keras.callbacks.TensorBoard):
        return bool(callback.histogram_freq or callback.embeddings_freq)
    return False


def check_weight_callbacks(callbacks: Sequence[keras.callbacks.Callback]) -> None:
    """Refuses the callbacks that read or write the weights during a fit under
    ``sharding="parameters"``: the model's variables have no storage until fit ends.

    Raises:
        ValueError: Naming ``sharding``, and the callbacks.
    """
    found = [type(c).__name__ for c in callbacks if reads_weights(c)]
    if found:
        raise invalid_argument(
            "sharding",
            "parameters",
            f"None, 'optimizer' or 'gradients' with callbacks that read or write the model's "
            f"weights during fit (received callbacks {found})",
            note="Under sharding='parameters' each weight is blocks on the replicas until fit "
            "ends: back up with backup_dir= (or BackupAndRestore), checkpoint or log the "
            "weights after fit (model.save, model.get_weights), or use "
            "sharding='gradients'. EarlyStopping is accepted "
            "without restore_best_weights, TensorBoard with histogram_freq=0 and "
            "embeddings_freq=0.",
        )


def steps_per_execution_for(
    given: int | str, callbacks: Sequence[keras.callbacks.Callback], *, runner: Runner
) -> int:
    """``steps_per_execution`` for one fit (or evaluation): the int given, or what ``"auto"`` picks.

    Batches run per ``tf.function`` call are rounded down to whole updates (at
    least one), and callbacks' batch hooks run once per call, with the logs of
    its last batch, as in Keras. ``"auto"`` runs one update per call when a
    callback has train-batch hooks (so they see every update), else the
    runner's ``auto_steps_per_execution`` (``SyncRunner``'s 32 batches: the
    per-call costs, i.e. fetching the logs, reducing the metrics across
    workers and the preemption vote, are paid once per 32 batches instead of
    every batch; calls still end at backup ``freq`` boundaries). Only the
    callbacks and the runner decide (never timing, nor which process is the
    chief): every worker must split an epoch into the same calls, since each
    call ends with collectives (logs, preemption vote). A balanced run takes the same
    calls: it decides between them, after at least its window of updates.
    """
    if given != "auto":
        return given
    # A hook counts whether the class overrides it or the instance sets it
    # (keras.callbacks.LambdaCallback assigns its hooks in __init__).
    base = keras.callbacks.Callback
    per_batch = [
        type(c).__name__
        for c in callbacks
        if any(h in vars(c) or getattr(type(c), h) is not getattr(base, h) for h in _BATCH_HOOKS)
    ]
    if per_batch:
        logger.info(
            "steps_per_execution='auto': one update per call, for the batch hooks of %s.",
            ", ".join(per_batch),
        )
        return 1
    return int(runner.auto_steps_per_execution)
