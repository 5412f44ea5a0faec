"""Finished input iterators, let go of on background threads.

Deleting a ``tf.data`` iterator waits for its autotuning thread (TF's ``RootDataset``), which
notices only at the end of its current optimisation period, a period that grows with the
iterator's life to seconds (up to a minute). Measured with the patterns convnet (4,096
examples, 256 updates, about 5 s an epoch, one core): each epoch's iterator took 2.3-4.8 s to
delete, the process idle meanwhile. Keras's own ``fit`` pays the same, inside its next epoch
(6.3 s for the first epoch, 11.0 and 9.2 s for the next two).

`release` hands such an iterator to a daemon thread of its own that drops it, so the next
epoch starts at once; the wait is spent beside the training instead of before it, and
iterators handed over together wait side by side, not one after another.

Before the interpreter exits it waits for every deletion still in progress (at most
`EXIT_SECONDS`). A daemon thread that comes back from TensorFlow's deletion while the
interpreter finalises is stopped inside TensorFlow's C++ frames, and that aborts the process
("FATAL: exception not rethrown"); it did, after an earlier bound of 60 s. The exit's wait is
what deleting the iterators on the main thread would have cost.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
import time
from typing import Any

logger = logging.getLogger(__name__)

#: How long the exit waits at most for the iterators still being let go of (TF's longest
#: optimisation period is a minute).
EXIT_SECONDS = 300.0
#: How long a thread waits for the caller to let go of its own reference to an object.
HANDOVER_SECONDS = 1.0


class Releaser:
    """Drops each object handed to it on a daemon thread of its own."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._running = 0

    def release(self, obj: Any) -> None:
        """Drops ``obj`` on a thread once the caller has let go of it too (its last other
        reference, a local name say, within `HANDOVER_SECONDS`; after that it is dropped
        anyway, and the deletion happens wherever that last reference goes)."""
        box = [obj]
        del obj
        with self._cond:
            self._running += 1
        threading.Thread(target=self._drop, args=(box,), name="tfdist-release", daemon=True).start()

    def _drop(self, box: list[Any]) -> None:
        try:
            item = box.pop()
            deadline = time.monotonic() + HANDOVER_SECONDS
            # Ours (``item``) and getrefcount's own: then the caller's is gone.
            while sys.getrefcount(item) > 2 and time.monotonic() < deadline:
                time.sleep(0.001)
            del item  # the slow part
        finally:
            with self._cond:
                self._running -= 1
                self._cond.notify_all()

    def drain(self, timeout: float | None = None) -> bool:
        """Waits until everything handed over is dropped; False if ``timeout`` came first."""
        with self._cond:
            return self._cond.wait_for(lambda: self._running == 0, timeout)


_releaser = Releaser()


def _at_exit() -> None:
    started = time.monotonic()
    if not _releaser.drain(EXIT_SECONDS):
        logger.warning(
            "tfdist: input iterators still being deleted after %.0f s; exiting anyway.",
            time.monotonic() - started,
        )


atexit.register(_at_exit)


def release(obj: Any) -> None:
    """Lets go of ``obj`` (an iterator no longer used) on a background thread."""
    _releaser.release(obj)


def drain(timeout: float | None = None) -> bool:
    """Waits until every object handed to `release` is dropped (see `Releaser.drain`)."""
    return _releaser.drain(timeout)
