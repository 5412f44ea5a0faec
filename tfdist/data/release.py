"""Finished input iterators, let go of on a background thread.

Deleting a ``tf.data`` iterator waits for its autotuning thread (TF's ``RootDataset``), which
notices only at the end of its current optimisation period, a period that grows with the
iterator's life to seconds. Measured with the patterns convnet (4,096 examples, 256 updates,
about 5 s an epoch, one core): each epoch's iterator took 2.3-4.8 s to delete, the process
idle meanwhile. Keras's own ``fit`` pays the same, inside its next epoch (6.3 s for the first
epoch, 11.0 and 9.2 s for the next two).

`release` hands such an iterator to one daemon thread that drops it, so the next epoch
starts at once; the wait is spent beside the training instead of before it. Before the
interpreter exits, the thread is drained (at most `DRAIN_SECONDS`), so that no iterator is
half deleted when TensorFlow shuts down.
"""

from __future__ import annotations

import atexit
import collections
import sys
import threading
import time
from typing import Any

#: How long the exit waits at most for the iterators still being let go of.
DRAIN_SECONDS = 60.0
#: How long the thread waits for the caller to let go of its own reference to an object.
HANDOVER_SECONDS = 1.0


class Releaser:
    """One daemon thread that drops the objects handed to it, in order."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._items: collections.deque[Any] = collections.deque()
        self._busy = False
        self._thread: threading.Thread | None = None

    def release(self, obj: Any) -> None:
        """Drops ``obj`` on the thread once the caller has let go of it too (its last other
        reference, a local name say, within `HANDOVER_SECONDS`; after that it is dropped
        anyway, and the deletion happens wherever that last reference goes)."""
        with self._cond:
            self._items.append(obj)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="tfdist-release", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._items:
                    self._busy = False
                    self._cond.notify_all()
                    self._cond.wait()
                item = self._items.popleft()
                self._busy = True
            deadline = time.monotonic() + HANDOVER_SECONDS
            # Ours (``item``) and getrefcount's own: then the caller's is gone.
            while sys.getrefcount(item) > 2 and time.monotonic() < deadline:
                time.sleep(0.001)
            del item  # the slow part, outside the lock

    def drain(self, timeout: float | None = None) -> bool:
        """Waits until everything handed over is dropped; False if ``timeout`` came first."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._items and not self._busy, timeout)


_releaser = Releaser()
atexit.register(_releaser.drain, DRAIN_SECONDS)


def release(obj: Any) -> None:
    """Lets go of ``obj`` (an iterator no longer used) on the background thread."""
    _releaser.release(obj)


def drain(timeout: float | None = None) -> bool:
    """Waits until every object handed to `release` is dropped (see `Releaser.drain`)."""
    return _releaser.drain(timeout)
