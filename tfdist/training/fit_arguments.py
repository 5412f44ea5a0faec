"""The checks of ``Trainer.fit``'s loop arguments, and the ``steps_per_execution`` a fit uses.

Apart from :mod:`tfdist.training.loop`, which runs the epochs: these run once
per ``fit``, before anything is built or traced, so that a bad argument gets
one clear error naming it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import keras

from tfdist.config import check_non_negative_int, check_positive_int, invalid_argument
from tfdist.strategies.base import Runner

logger = logging.getLogger(__name__)

_BATCH_HOOKS = ("on_batch_begin", "on_batch_end", "on_train_batch_begin", "on_train_batch_end")


def check_steps_per_execution(value: Any) -> Any:
    """Checks the Trainer's ``steps_per_execution``: a positive int or ``"auto"``."""
    if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise invalid_argument("steps_per_execution", value, "a positive integer or 'auto'")
    return value


@dataclasses.dataclass(frozen=True)
class FitArguments:
    """``Trainer.fit``'s loop arguments, checked (``verbose`` as an int, callbacks a sequence)."""

    epochs: int
    steps_per_epoch: int | None
    global_batch_size: int | None
    validation_steps: int | None
    initial_epoch: int
    verbose: int
    callbacks: Sequence[keras.callbacks.Callback]


def check_fit_arguments(
    *,
    epochs: Any,
    steps_per_epoch: Any,
    global_batch_size: Any,
    validation_steps: Any,
    initial_epoch: Any,
    verbose: Any,
    callbacks: Any,
    requires_steps_per_epoch: bool,
) -> FitArguments:
    """Checks ``Trainer.fit``'s loop arguments (``global_batch_size`` is the data's to check)."""
    check_positive_int("epochs", epochs)
    check_positive_int("steps_per_epoch", steps_per_epoch, allow_none=True)
    check_positive_int("validation_steps", validation_steps, allow_none=True)
    check_non_negative_int("initial_epoch", initial_epoch)
    if verbose not in ("auto", 0, 1, 2):
        raise invalid_argument("verbose", verbose, "'auto', 0, 1 or 2")
    callbacks = () if callbacks is None else callbacks
    if isinstance(callbacks, keras.callbacks.Callback) or not all(
        isinstance(c, keras.callbacks.Callback) for c in callbacks
    ):
        note = ""
        if isinstance(callbacks, keras.callbacks.CallbackList):
            note = "Pass its callbacks as a list (callback_list.callbacks); the Trainer makes one."
        raise invalid_argument(
            "callbacks", callbacks, "a list of keras.callbacks.Callback", note=note
        )
    if steps_per_epoch is None and requires_steps_per_epoch:
        raise invalid_argument(
            "steps_per_epoch",
            None,
            "a positive integer under strategy 'parameter_server'",
            note="Its workers read their datasets independently and repeat them, so an epoch has "
            "no natural end: say how many batches make one.",
        )
    return FitArguments(
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        global_batch_size=global_batch_size,
        validation_steps=validation_steps,
        initial_epoch=initial_epoch,
        verbose=1 if verbose == "auto" else int(verbose),
        callbacks=callbacks,
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
    call ends with collectives (logs, preemption vote).
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
