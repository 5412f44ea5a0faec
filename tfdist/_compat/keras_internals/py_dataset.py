"""Keras's own parallel reader of a ``keras.utils.PyDataset``: its ``OrderedEnqueuer``.

Keras's ``fit`` reads a ``PyDataset`` whose ``workers > 1`` (or ``use_multiprocessing``)
through ``OrderedEnqueuer``: that many threads (or forked processes) call ``__getitem__``
ahead of the loop, at most ``max_queue_size`` batches ahead, and the batches come out in
index order. tfdist reads it the same way, so the options do what they do in Keras.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

_CHILDREN_RESET: list[bool] = []


def reads_in_parallel(py_dataset: Any) -> bool:
    """Whether Keras's ``fit`` reads ``py_dataset`` through its enqueuer (Keras's own rule)."""
    workers = py_dataset.workers
    return workers > 1 or (workers > 0 and bool(py_dataset.use_multiprocessing))


def enqueued_batches(py_dataset: Any, num_batches: int | None) -> Iterator[Any]:
    """Batches ``0 .. num_batches - 1`` of ``py_dataset`` (``None``: endless), in order, read by
    Keras's ``OrderedEnqueuer`` with the dataset's ``workers``, ``use_multiprocessing`` and
    ``max_queue_size``; the enqueuer is stopped when the pass ends or is abandoned, and its
    reader processes (``use_multiprocessing``) are ended and joined then."""
    # Private: keras.src.trainers.data_adapters.py_dataset_adapter has no public enqueuer.
    from keras.src.trainers.data_adapters.py_dataset_adapter import OrderedEnqueuer

    if py_dataset.use_multiprocessing:
        _default_sigterm_in_forked_children()
    enqueuer = OrderedEnqueuer(
        py_dataset,
        workers=py_dataset.workers,
        use_multiprocessing=py_dataset.use_multiprocessing,
        max_queue_size=py_dataset.max_queue_size,
        shuffle=False,
    )
    pools = _track_pools(enqueuer) if py_dataset.use_multiprocessing else []
    enqueuer.start()
    try:
        if num_batches == 0:
            return
        for i, batch in enumerate(enqueuer.get()):
            yield batch
            if num_batches is not None and i >= num_batches - 1:
                return
    finally:
        enqueuer.stop()
        # stop() only closes the pool: its processes would go on with the reads queued ahead
        # (up to max_queue_size), then exit unjoined. They end with the pass instead.
        for pool in pools:
            pool.terminate()


def _track_pools(enqueuer: Any) -> list[Any]:
    """The process pools ``enqueuer`` makes (one per start), as it makes them."""
    pools: list[Any] = []
    make_pool = enqueuer.executor_fn

    def tracked(*args: Any) -> Any:
        pool = make_pool(*args)
        pools.append(pool)
        return pool

    enqueuer.executor_fn = tracked
    return pools


def _default_sigterm_in_forked_children() -> None:
    """Forked reader processes end on SIGTERM, as their pool expects: they would inherit the
    fit's SIGTERM handler (``training.preemption``), which only notes the signal."""
    if _CHILDREN_RESET:
        return

    def reset() -> None:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        except ValueError:  # not the child's main thread: nothing was inherited there
            pass

    os.register_at_fork(after_in_child=reset)
    _CHILDREN_RESET.append(True)
