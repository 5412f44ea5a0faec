"""What tfdist's callbacks need of ``fit`` and of Keras's progress bar that Keras keeps private.

Each function names one reach past Keras's public surface, with the reason;
``tests/training/backup/test_backup_callback.py`` fails if a Keras release moves it.
"""

from __future__ import annotations

import inspect
import time

import keras


def set_initial_epoch(model: keras.Model, epoch: int) -> None:
    """Makes the running ``fit`` start at ``epoch``; call it from ``on_train_begin``.

    Reason: a callback has no public way to move ``fit``'s first epoch; Keras's
    own ``BackupAndRestore`` sets this attribute, which ``fit`` reads right
    after ``on_train_begin``.
    """
    model._initial_epoch = epoch


def calling_callback_list(
    callback: keras.callbacks.Callback,
) -> keras.callbacks.CallbackList | None:
    """The ``CallbackList`` whose ``on_train_begin`` is calling ``callback``'s, if any.

    Reason: Keras gives a callback no handle on its ``CallbackList``; the
    caller's frame (``self`` of ``CallbackList.on_train_begin``) is the one
    place it is found. Returns None when it is not there.
    """
    frame = inspect.currentframe()
    try:
        # 0: here, 1: callback.on_train_begin, 2: its caller, a subclass's
        # on_train_begin or the list; look a few frames up.
        for _ in range(6):
            if frame is None:
                break
            caller = frame.f_locals.get("self")
            if isinstance(caller, keras.callbacks.CallbackList) and any(
                c is callback for c in caller.callbacks
            ):
                return caller
            frame = frame.f_back
    finally:
        del frame  # a frame reference held here would keep every local of fit alive
    return None


def progress_bar_draws(callback: keras.callbacks.ProgbarLogger, batch: int) -> bool:
    """Whether ``callback``'s bar would draw at the end of ``batch`` (0-based) of an epoch.

    Reason: Keras's ``Progbar`` redraws at most every ``interval`` seconds
    (0.05 s at ``verbose=1``), yet ``ProgbarLogger`` hands it every batch's
    logs, reading them all; the values of a batch it does not draw are never
    shown. When it draws is decided by its private ``_last_update``.
    """
    bar = callback.progbar
    if callback.verbose != 1 or bar is None:
        return True  # verbose 2 reads nothing per batch; the first batch makes the bar and draws
    if bar.target is not None and batch + 1 >= bar.target:
        return True  # the epoch's last batch finalises the bar
    return time.time() - bar._last_update >= bar.interval
