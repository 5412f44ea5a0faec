"""The parameter-server workers' progress: update counts and rates, and stuck workers.

``PSRunner`` watches every training call the coordinator runs on a worker
(``_compat.coordinator.watch_calls``): when it started, when it finished.
From that come

* each worker's completed calls and its rate over the last seconds
  (`WorkerWatch.update_counts`, `WorkerWatch.update_rates`), for a
  straggler report;
* stuck workers. A worker is stuck when its running call has gone on longer
  than a timeout learned from the calls that finished:
  ``clamp(factor * longest, floor, ceiling)``, where ``longest`` is the longest
  finished call so far, not counting a worker's first call of each traced
  function (it includes building the function there); such a first call, or any
  call before one has finished, gets ``first`` instead. A stuck worker's TF
  heartbeats may be fine (its input pipeline hangs, or SIGSTOP froze it): TF's
  coordinator would wait for it forever.

A stuck worker is logged (a WARNING naming it, e.g. ``worker:1``, and for how
long) and treated as lost: its call is cancelled on the coordinator and runs
again on another worker, and it gets no more calls from this coordinator (a
new ``make_strategy`` starts with every worker). The fit fails with
``WorkerStuckError`` instead when no other worker is left, or when the call's
function returned and its outputs never reached the coordinator (a call that
far along cannot move). A launched job then exits with
``tfdist.config.STUCK_EXIT_CODE`` for a restart (``training/health/monitor.py``).
Detection takes the timeout plus at most one polling interval
(``floor / 10``, between 0.05 s and 1 s).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from tfdist._compat.tf_internals.coordinator import (
    fail_queued,
    park_worker,
    parked_workers,
    rerun_elsewhere_error,
    watch_calls,
)
from tfdist.cluster import task_label
from tfdist.config import WatchdogOptions
from tfdist.strategies.ps.failures import WorkerStuckError

logger = logging.getLogger(__name__)

#: ``update_rates()`` counts the calls that finished in this many last seconds.
RATE_WINDOW_SECONDS = 30.0


#: What a ``PSRunner`` uses unless given its own (a Trainer sets its ``watchdog``'s).
DEFAULT_TIMEOUTS = WatchdogOptions(floor=120.0)


@dataclasses.dataclass(eq=False)
class _Call:
    worker: int
    function: str
    start: float
    first: bool  # the worker's first call of this function
    cancel: Callable[[BaseException], bool]
    verdict: BaseException | None = None  # raised in place of the cancelled call's error


class WorkerWatch:
    """Per-worker progress of a coordinator's training calls (a ``CallObserver``).

    Thread-safe: worker threads report calls, a watchdog thread checks them,
    the training loop reads the counts.
    """

    def __init__(
        self,
        coordinator: Any,
        num_workers: int,
        timeouts: WatchdogOptions,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._coordinator = coordinator
        self.num_workers = num_workers
        self.timeouts = timeouts
        self._clock = clock
        self._lock = threading.Lock()
        self._running: dict[int, _Call] = {}
        self._built: set[tuple[int, str]] = set()  # (worker, function) that finished once
        self._longest: float | None = None  # the longest finished call, first ones left out
        self._counts = [0] * num_workers
        self._finished = [collections.deque() for _ in range(num_workers)]  # recent end times
        self._since: float | None = None  # the first call's start
        self._thread: threading.Thread | None = None
        #: Whether stuck calls are looked for (a Trainer with ``watchdog=None`` sets False).
        self.checking = True
        #: The error that ended the fit, once a stuck call could not move (or None).
        self.failure: BaseException | None = None

    def attach(self) -> None:
        """Watches the calls scheduled from now on, and starts the watchdog thread once."""
        watch_calls(self._coordinator, self)
        if self._thread is None:
            self._thread = threading.Thread(
                target=_watchdog_loop,
                args=(weakref.ref(self), self.timeouts.interval),
                name="tfdist-ps-watchdog",
                daemon=True,
            )
            self._thread.start()

    # -- CallObserver: called in the coordinator's worker threads -----------------------------

    def call_started(
        self, worker: int, function: str, cancel: Callable[[BaseException], bool]
    ) -> _Call:
        now = self._clock()
        with self._lock:
            call = _Call(worker, function, now, (worker, function) not in self._built, cancel)
            self._running[worker] = call
            if self._since is None:
                self._since = now
        return call

    def call_ended(self, call: _Call, error: BaseException | None) -> BaseException | None:
        now = self._clock()
        with self._lock:
            if self._running.get(call.worker) is call:
                del self._running[call.worker]
            if call.verdict is not None and error is not None:
                return call.verdict
            if error is None:
                self._counts[call.worker] += 1
                finished = self._finished[call.worker]
                finished.append(now)
                while finished and finished[0] < now - RATE_WINDOW_SECONDS:
                    finished.popleft()
                if call.first:
                    self._built.add((call.worker, call.function))
                else:
                    duration = now - call.start
                    self._longest = max(self._longest or 0.0, duration)
        return None

    # -- reports -------------------------------------------------------------------------------

    def update_counts(self) -> dict[str, int]:
        """Training calls each worker finished (each is ``steps_per_execution`` updates)."""
        with self._lock:
            return {task_label("worker", i): n for i, n in enumerate(self._counts)}

    def update_rates(self, window: float = RATE_WINDOW_SECONDS) -> dict[str, float]:
        """Each worker's finished calls per second over the last ``window`` seconds (at most 30).

        Over the time since the first call started, if that is shorter.
        """
        now = self._clock()
        window = min(window, RATE_WINDOW_SECONDS)
        with self._lock:
            span = min(window, now - self._since) if self._since is not None else 0.0
            return {
                task_label("worker", i): (
                    sum(1 for t in ends if t >= now - span) / span if span > 0 else 0.0
                )
                for i, ends in enumerate(self._finished)
            }

    def log_update_rates(self) -> dict[str, float]:
        """Logs (INFO) and returns each worker's calls finished and its recent rate."""
        rates, counts = self.update_rates(), self.update_counts()
        logger.info(
            "Parameter-server workers' training calls (finished, per second over the last %.0f s): "
            "%s",
            RATE_WINDOW_SECONDS,
            ", ".join(f"{w} {counts[w]} ({rates[w]:.2f}/s)" for w in counts),
        )
        return rates

    # -- the watchdog --------------------------------------------------------------------------

    def timeout_of(self, call: _Call) -> float:
        return self.timeouts.timeout(None if call.first else self._longest)

    def check(self) -> list[str]:
        """Treats each worker whose running call is past its timeout as lost. Returns them."""
        if not self.checking:
            return []
        now = self._clock()
        with self._lock:
            overdue = [
                (call, now - call.start, self.timeout_of(call))
                for call in self._running.values()
                if call.verdict is None and now - call.start > self.timeout_of(call)
            ]
            for call, elapsed, _ in overdue:
                call.verdict = self._give_up(call, elapsed)
        for call, elapsed, timeout in overdue:
            label = task_label("worker", call.worker)
            last = isinstance(call.verdict, WorkerStuckError)
            error = call.verdict if last else _unmovable(label, elapsed)
            if not call.cancel(error):
                last = True  # its outputs never came: the call cannot move
            if last:
                self.failure = self.failure or error
                fail_queued(self._coordinator, error)  # nothing would run them
            logger.warning(
                "%s is stuck: its training call has run for %.1f s, past its timeout (%s). %s",
                label,
                elapsed,
                self._why(call, timeout),
                "It cannot run elsewhere: stopping the fit."
                if last
                else f"Treating it as lost: the call runs again on another worker, and {label} "
                "gets no more calls.",
            )
        return [task_label("worker", call.worker) for call, _, _ in overdue]

    def _give_up(self, call: _Call, elapsed: float) -> BaseException:
        """Parks the worker and returns the error that re-runs its call (or ends the fit)."""
        label = task_label("worker", call.worker)
        parked = parked_workers(self._coordinator)
        others = [w for w in range(self.num_workers) if w != call.worker and w not in parked]
        if not others:
            return WorkerStuckError(
                f"{label} is stuck: its training call has run for {elapsed:.0f} s, and no other "
                "worker is left to run it. Restart the job; with backup_dir set it resumes from "
                "the last backup."
            )
        park_worker(self._coordinator, call.worker)
        return rerun_elsewhere_error(call.worker, f"{label} stuck for {elapsed:.0f} s")

    def _why(self, call: _Call, timeout: float) -> str:
        if call.first or self._longest is None:
            return f"the allowance for a first call, {timeout:.3g} s"
        return (
            f"{self.timeouts.factor:g} x the longest call so far ({self._longest:.3g} s), "
            f"within [{self.timeouts.floor:g}, {self.timeouts.ceiling:g}] s: {timeout:.3g} s"
        )


def _unmovable(label: str, elapsed: float) -> WorkerStuckError:
    """The error of a stuck call whose function returned and whose outputs never came."""
    return WorkerStuckError(
        f"{label} is stuck: its training call has waited {elapsed:.0f} s for its outputs, and a "
        "call that far along cannot move to another worker. Restart the job; with backup_dir set "
        "it resumes from the last backup."
    )


def _watchdog_loop(watch_ref: Callable[[], WorkerWatch | None], poll_seconds: float) -> None:
    """The watchdog thread: checks every ``poll_seconds`` while its ``WorkerWatch`` lives."""
    while True:
        time.sleep(poll_seconds)
        watch = watch_ref()
        if watch is None:
            return
        try:
            watch.check()
        except Exception:  # noqa: BLE001 - a watchdog must not die silently; log and go on
            logger.exception("The parameter-server watchdog failed to check the workers")
        del watch
