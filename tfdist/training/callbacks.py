"""Keras callbacks in a multi-worker run: only the chief writes for real.

Every worker runs the same callbacks (saving may read variables through
collectives, so all workers must take part), but on a non-chief worker each
known file-writing callback is pointed at a private temporary directory that
is removed at the end of training.
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from typing import Iterator, Sequence

import keras

logger = logging.getLogger(__name__)

# Callback type -> the attribute that holds where it writes.
_PATH_ATTRIBUTES = (
    (keras.callbacks.ModelCheckpoint, "filepath"),
    (keras.callbacks.TensorBoard, "log_dir"),
    (keras.callbacks.CSVLogger, "filename"),
)


@contextlib.contextmanager
def chief_writes_only(callbacks: Sequence[keras.callbacks.Callback], *, is_chief: bool,
                      task_label: str) -> Iterator[None]:
    """Redirects file-writing callbacks to a temporary place on non-chief workers.

    Args:
        callbacks: The user's callbacks; their paths are restored afterwards.
        is_chief: Whether this process is the chief (then nothing changes).
        task_label: ``task_type:task_id``, used in the temporary directory name.
    """
    if is_chief:
        yield
        return
    tmp = tempfile.mkdtemp(prefix=f"tfdist-{task_label.replace(':', '-')}-")
    saved = []
    try:
        for cb in callbacks:
            for cls, attr in _PATH_ATTRIBUTES:
                if isinstance(cb, cls) and getattr(cb, attr, None):
                    original = str(getattr(cb, attr))
                    saved.append((cb, attr, original))
                    setattr(cb, attr, os.path.join(tmp, os.path.basename(original.rstrip("/")) or "out"))
        yield
    finally:
        for cb, attr, original in saved:
            setattr(cb, attr, original)
        shutil.rmtree(tmp, ignore_errors=True)
        logger.debug("%s removed its temporary callback outputs in %s", task_label, tmp)
