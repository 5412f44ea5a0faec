"""``ClusterCoordinator`` internals: each scheduled call on a worker, watched and cancellable alone.

TF's coordinator runs one closure at a time per worker, in a thread per worker,
as a blocking remote call. It has no per-worker timeout and one
``CancellationManager`` for all closures: a worker whose call never returns
(a hung input pipeline, a process frozen with SIGSTOP) holds its closure
forever, and the coordinator's ``join`` and ``fetch`` wait for it. tfdist's
parameter-server watchdog (``strategies/ps/watchdog.py``) needs three things
no public API offers, each behind a named function here:

* `watch_calls`: every training call scheduled from then on gets its own
  cancellation manager and reports its start and end (worker index, function)
  to an observer, which may replace the call's error;
* `rerun_elsewhere_error`: the error that makes the coordinator put a
  cancelled closure back in its queue (another worker runs it) without marking
  the worker failed;
* `park_worker`: that worker's thread takes no more closures.

A call is watched until its outputs reached the coordinator: TF's remote
function call may return before the worker computed them, and the wait then
happens in the fetch of its outputs, which no cancellation manager reaches.
A call stuck there cannot move to another worker; ``cancel`` fails it instead
(its outputs and the coordinator's ``join`` raise the given error).

A remote call's cancellation stops waiting on the coordinator (the gRPC call
is cancelled) but not the remote work: a stuck worker stays stuck, and a call
that resumes later may still apply its updates (as when TF re-runs the
closure of a failed worker: at least once).
"""

from __future__ import annotations

import dataclasses
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Protocol


class CallObserver(Protocol):
    """What `watch_calls` reports each scheduled call to (called in the worker's thread)."""

    def call_started(
        self, worker: int, function: str, cancel: Callable[[BaseException], bool]
    ) -> Any:
        """A call of ``function`` started on worker ``worker``. Returns a token.

        ``cancel(error)`` cancels the call and returns True; once the function
        returned and the call waits for its outputs, it fails the call with
        ``error`` instead and returns False.
        """

    def call_ended(self, token: Any, error: BaseException | None) -> BaseException | None:
        """The call ended (``error`` None: it finished). An error to raise instead, or None."""


# Per coordinator worker thread: .manager, the CancellationManager of its running call;
# .closure, the closure it processes; .pending, (observer, token) of a call whose outputs are
# being fetched.
_local = threading.local()
_thread_cancellation_installed = False


def _install_thread_cancellation() -> None:
    """Lets each thread run its calls under its own ``CancellationManager``. Idempotent.

    TF keeps the active manager in one process-wide global
    (``cancellation._active_context``, read by ``context.call_function``):
    worker threads calling at once would register their calls with each
    other's manager, or none. The replacement reads this thread's manager
    first and falls back to TF's global.
    """
    global _thread_cancellation_installed
    if _thread_cancellation_installed:
        return
    from tensorflow.python.eager import cancellation

    upstream = cancellation.context  # fails loudly if TF renamed it

    def context() -> Any:
        manager = getattr(_local, "manager", None)
        return upstream() if manager is None else manager

    cancellation.context = context
    _thread_cancellation_installed = True


def _current_worker() -> int | None:
    """The index of the coordinator worker whose thread runs this closure, if any."""
    from tensorflow.python.distribute.coordinator import coordinator_context

    # The coordinator's thread-local dispatch context, set around each closure's execution.
    dispatch = coordinator_context.get_current_dispatch_context()
    return None if dispatch is None else dispatch.worker_index


@dataclasses.dataclass(eq=False)
class _Hooks:
    """One coordinator's watched calls: the observer (a weakref) and the parked workers."""

    observer: Any = None  # weakref.ref to a CallObserver
    parked: set[int] = dataclasses.field(default_factory=set)
    queue: Any = None  # the coordinator's closure queue
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


class _PerCallCancellation:
    """Stands in for the closure queue's ``CancellationManager``: one manager per call.

    TF calls ``start_cancel`` on it to cancel every closure after an error (and
    replaces it with a plain manager afterwards; `watch_calls` puts this
    back), and reads ``is_cancelled``; each call it wraps gets a fresh manager,
    so a closure cancelled on one worker runs again on another.
    """

    def __init__(self, hooks: _Hooks) -> None:
        self._hooks = hooks
        self._cancelled = False
        self._running: set[Any] = set()

    @property
    def is_cancelled(self) -> bool:
        return self._cancelled

    def start_cancel(self) -> None:
        with self._hooks.lock:
            self._cancelled = True
            running = list(self._running)
        for manager in running:
            manager.start_cancel()

    def get_cancelable_function(self, concrete_function: Any) -> Callable[..., Any]:
        name = getattr(concrete_function, "name", "function")
        name = name.decode() if isinstance(name, bytes) else str(name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._call(concrete_function, name, args, kwargs)

        return call

    def _call(self, function: Any, name: str, args: tuple, kwargs: dict) -> Any:
        from tensorflow.python.eager import cancellation

        manager = cancellation.CancellationManager()
        with self._hooks.lock:
            if self._cancelled:
                manager.start_cancel()
            self._running.add(manager)
        observer = self._hooks.observer() if self._hooks.observer else None
        worker = _current_worker()
        token = None
        returned = threading.Event()
        closure = getattr(_local, "closure", None)
        if observer is not None and worker is not None:
            token = observer.call_started(
                worker, name, _canceller(manager, returned, closure, self._hooks.queue)
            )
        _local.manager = manager
        try:
            result = function(*args, **kwargs)
        except Exception as error:
            replacement = observer.call_ended(token, error) if token is not None else None
            if replacement is not None:
                raise replacement from error
            raise
        finally:
            _local.manager = None
            with self._hooks.lock:
                self._running.discard(manager)
        returned.set()
        if token is not None:
            if closure is not None:
                _local.pending = (observer, token)  # ended once its outputs are fetched
            else:
                observer.call_ended(token, None)
        return result


def _canceller(
    manager: Any, returned: threading.Event, closure: Any, queue: Any
) -> Callable[[BaseException], bool]:
    """The ``cancel(error)`` of one call (see `CallObserver.call_started`)."""

    def cancel(error: BaseException) -> bool:
        if not returned.is_set() or closure is None:
            manager.start_cancel()
            return True
        # Waiting for its outputs: fail the call; whoever waits for its outputs or joins
        # raises ``error``.
        _FAILED.add(closure)
        closure.maybe_call_with_output_remote_value(lambda r: r._set_error(error))
        if queue is not None:
            queue.mark_failed(error)
        return False

    return cancel


# Closures a watchdog failed while they waited for their outputs (see ``_canceller``).
_FAILED: weakref.WeakSet[Any] = weakref.WeakSet()


def fail_queued(coordinator: Any, error: BaseException) -> None:
    """Takes every closure queued on ``coordinator`` off, its outputs failed with ``error``.

    For a fit that cannot go on: frees the queue's slots (a ``schedule`` waiting
    for one goes on, and raises the queue's error) and ends every wait on a
    queued call's outputs. A closure put back for another worker is queued too.
    """
    import queue as queues

    queue = _closure_queue(coordinator)
    with queue._queue_lock:
        while True:
            try:
                closure = queue._queue.get(block=False)
            except queues.Empty:
                return
            queue._queue_free_slot_condition.notify()
            closure.maybe_call_with_output_remote_value(lambda r: r._set_error(error))


def _fetch_watched(process: Callable[[Any], None]) -> Callable[[Any], None]:
    """A worker's ``_process_closure`` that ends the watched call once its outputs arrived."""

    def run(closure: Any) -> None:
        _local.closure, _local.pending = closure, None
        try:
            process(closure)
        except AssertionError:
            # A call failed while stuck came back: TF's queue no longer counts it in flight.
            if closure not in _FAILED:
                raise
        finally:
            pending, _local.closure, _local.pending = _local.pending, None, None
            if pending is not None:
                observer, token = pending
                observer.call_ended(token, None)

    return run


# coordinator -> its hooks. Weak keys: nothing set on TF's object, forgotten with it.
_HOOKS: weakref.WeakKeyDictionary[Any, _Hooks] = weakref.WeakKeyDictionary()


def _closure_queue(coordinator: Any) -> Any:
    # The coordinator's one queue of closures, which every worker thread takes from.
    return coordinator._cluster.closure_queue


def _parking_get(queue: Any, hooks: _Hooks) -> Callable[..., Any]:
    """``queue.get`` that holds a parked worker's thread before it takes a closure."""
    upstream = queue.get
    queue_ref = weakref.ref(queue)

    def get(timeout: float | None = None, tag: Any = None) -> Any:
        # Worker threads pass their index as the tag; parked ones wait here until the queue stops.
        while tag in hooks.parked:
            live = queue_ref()
            if live is None or not live._should_process_closures:
                break
            time.sleep(0.5)
        return upstream(timeout=timeout, tag=tag)

    return get


def watch_calls(coordinator: Any, observer: CallObserver) -> None:
    """Reports each training call ``coordinator`` schedules from now on to ``observer``.

    Cheap and idempotent: the runner calls it before each ``schedule`` (TF
    swaps in a plain cancellation manager after an error; this puts the
    per-call one back). Only ``schedule``'s calls are watched; the calls that
    build per-worker datasets use another manager.

    Args:
        coordinator: A ``ClusterCoordinator``.
        observer: Told of each call's start and end; held weakly (the latest one wins).
    """
    _install_thread_cancellation()
    hooks = _HOOKS.get(coordinator)
    queue = _closure_queue(coordinator)
    if hooks is None:
        hooks = _HOOKS[coordinator] = _Hooks(queue=queue)
        queue.get = _parking_get(queue, hooks)  # an instance attribute: only this coordinator's
        for worker in coordinator._cluster.workers:
            # Instance attributes too; each worker's thread calls self._process_closure(closure).
            worker._process_closure = _fetch_watched(worker._process_closure)
    if hooks.observer is None or hooks.observer() is not observer:
        hooks.observer = weakref.ref(observer)
    if not isinstance(queue._cancellation_mgr, _PerCallCancellation):
        # Read by Cluster.schedule for each new closure; replaced by TF after an error.
        queue._cancellation_mgr = _PerCallCancellation(hooks)


def rerun_elsewhere_error(worker: int, reason: str) -> Exception:
    """The error that makes the coordinator run a cancelled closure again on any worker.

    ``WorkerPreemptionHandler.wait_on_failure`` treats a ``CancelledError``
    naming a ``/job:`` as derived from a transient failure: it puts the closure
    back in the queue and marks neither the worker nor the run failed.
    """
    import tensorflow as tf

    return tf.errors.CancelledError(
        None, None, f"{reason} (/job:worker/replica:0/task:{worker}); running the call elsewhere"
    )


def wait_fetchable(
    remote_value: Any, failure: Callable[[], BaseException | None], poll: float = 0.5
) -> None:
    """Waits until ``remote_value.fetch()`` will not wait on a worker; raises ``failure()`` if set.

    ``fetch`` waits for the call to end (its closure may wait in the queue for
    a worker), then on the value's fetch lock, which a worker thread copying
    the outputs holds while it waits for them: if the workers are stuck, no
    cancellation reaches either wait. This waits on both in slices and gives
    up with the watchdog's verdict.
    """

    def check() -> None:
        error = failure()
        if error is not None:
            raise error

    # First the call's end (a queued or running closure), then a worker thread's copy of it.
    ended = getattr(remote_value, "_status_available_event", None)
    while ended is not None and not ended.wait(timeout=poll):
        check()
    lock = getattr(remote_value, "_has_fetched_to_local_lock", None)
    while lock is not None and not lock.acquire(timeout=poll):
        check()
    if lock is not None:
        lock.release()


def park_worker(coordinator: Any, worker: int) -> None:
    """Worker ``worker``'s thread takes no more closures from ``coordinator`` (for its lifetime)."""
    hooks = _HOOKS.get(coordinator)
    if hooks is None:
        raise RuntimeError("park_worker needs watch_calls(coordinator, ...) first")
    hooks.parked.add(worker)


def parked_workers(coordinator: Any) -> frozenset[int]:
    """The workers `park_worker` parked on ``coordinator``."""
    hooks = _HOOKS.get(coordinator)
    return frozenset(hooks.parked) if hooks else frozenset()
