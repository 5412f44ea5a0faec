"""``tf.train.Checkpoint``'s asynchronous writer: its error, and letting it go.

With ``CheckpointOptions(enable_async=True)``, ``Checkpoint.write`` copies the
values to host memory and returns; TF's ``AsyncCheckpointHelper`` writes the
files in its own thread. Two things it offers no public API for:

* a failed write's error: ``Checkpoint.sync()`` waits for the write but does
  not raise it; TF keeps it until the *next* asynchronous write (or the exit
  of the process), so a failed last backup would go unnoticed;
* its end: the helper registers itself with ``atexit``, which keeps its
  thread and its host copy of every variable alive until the process exits,
  however many checkpoints are made and dropped.

And one hook it calls: `WrittenFromItself`, a Python state that the
writer serializes from the object itself.
"""

from __future__ import annotations

import atexit
from typing import Any

import tensorflow as tf


class WrittenFromItself(tf.train.experimental.PythonState):
    """A ``PythonState`` that an asynchronous write serializes from the object itself.

    TF's asynchronous writer copies each trackable to the host through its
    ``_copy_trackable_to_cpu``, in a ``tf.function`` whose Python runs only when
    it is traced, so a Python copy would be stale from the second save on. Left
    out of the copy, the state is serialized from the object in the writer
    thread: it must not change until the write is done. (Without this no-op,
    TF logs a warning for it at every trace, and that warning's traceback keeps
    the writer, and the model it writes, alive in whatever holds log records.)
    """

    def _copy_trackable_to_cpu(self, object_map: Any) -> None:
        del object_map  # not copied: the writer reads the object itself


def _helper(checkpoint: Any) -> Any:
    """The checkpoint's asynchronous writer, or None before its first asynchronous write."""
    # Checkpoint makes it lazily at the first asynchronous write and keeps it on this attribute.
    if not hasattr(checkpoint, "_async_checkpointer_impl"):
        raise RuntimeError(
            "tf.train.Checkpoint has no _async_checkpointer_impl any more: tfdist cannot see "
            "whether an asynchronous backup write failed. Use "
            "tfdist.BackupOptions(..., asynchronous=False)."
        )
    return checkpoint._async_checkpointer_impl


def take_async_write_error(checkpoint: Any) -> BaseException | None:
    """The error of ``checkpoint``'s last asynchronous write, cleared; call after ``sync()``.

    Returns:
        The exception the writer thread caught (in the write or in a write
        callback), or None.
    """
    helper = _helper(checkpoint)
    if helper is None:
        return None
    if not hasattr(helper, "_async_error"):
        raise RuntimeError(
            "TF's AsyncCheckpointHelper has no _async_error any more: tfdist cannot see "
            "whether an asynchronous backup write failed. Use "
            "tfdist.BackupOptions(..., asynchronous=False)."
        )
    # The writer thread stores it before marking the write done, so after sync() it is set.
    error, helper._async_error = helper._async_error, None
    return error


def release_async_writer(checkpoint: Any) -> None:
    """Stops ``checkpoint``'s writer thread and drops its host copies (waits for a write first).

    Take the last write's error before (`take_async_write_error`): a
    pending one is raised here.
    """
    helper = _helper(checkpoint)
    if helper is None:
        return
    # What atexit would run: waits for the write in flight, then ends the thread.
    helper._join_async_save_thread()
    atexit.unregister(helper._join_async_save_thread)
    checkpoint._async_checkpointer_impl = None
