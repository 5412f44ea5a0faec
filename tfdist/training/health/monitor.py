"""A fit's health thread: the progress watchdog and the straggler report, beside the loop.

`Health` runs one daemon thread per task for the length of a fit.
The loop marks its sections (`Health.section`); every ``interval`` the
thread

* publishes this task's state (section, update, how long, and this
  worker's last window of step sections, cut at the same wall-clock moments on
  every task and kept in each state until the next one) to the tasks'
  `Board`;
* checks the current section against its learned timeout, and whether
  another task found a hang; on a hang it blames the stuck task, dumps the
  Python stacks of all threads and exits with ``STUCK_EXIT_CODE``
  (see `tfdist.training.health.watchdog`);
* on the chief, gathers the workers' step sections into the straggler
  report (see `tfdist.training.health.stragglers`).
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from tfdist import _compat
from tfdist.config import STUCK_EXIT_CODE
from tfdist.strategies.base import (
    ClockedRunner,
    RatedRunner,
    Runner,
    RunnerStuckError,
    SelfWatchingRunner,
    WatchingRunner,
)
from tfdist.training.health.board import Board
from tfdist.training.health.stragglers import StragglerOptions, StragglerReport
from tfdist.training.health.watchdog import (
    LearnedTimeouts,
    WatchdogOptions,
    blame,
    conclusive,
    describe_here,
    running_py_function,
)

logger = logging.getLogger(__name__)


def _interactive() -> bool:
    return "ipykernel" in sys.modules or hasattr(sys, "ps1")


class Health:
    """The watchdog and straggler report of one fit on this task (a context manager).

    Args:
        runner: The strategy's runner (its task label, chief flag, and the capabilities it
            declares: a `ClockedRunner`, `SelfWatchingRunner` or `RatedRunner`).
        labels: Every task of the cluster that runs the loop.
        watchdog: The watchdog's options, or None for no watchdog.
        stragglers: The straggler report's options, or None for none.
        summary_dir: Where the chief writes the straggler scalars, or None.
        has_backup: Whether a restart resumes from a backup (words the exit message).
    """

    def __init__(
        self,
        runner: Runner,
        labels: Sequence[str],
        *,
        watchdog: WatchdogOptions | None,
        stragglers: StragglerOptions | None,
        summary_dir: str | None = None,
        has_backup: bool = False,
    ) -> None:
        self.has_backup = has_backup
        self.label = runner.task_label
        self.host = socket.gethostname()
        shared = len(labels) > 1 and _compat.coordination_service_enabled()
        self.board = Board(labels, shared=shared)
        self.watchdog = watchdog
        self.timeouts = LearnedTimeouts(watchdog) if watchdog else None
        clock = runner.step_clock if isinstance(runner, ClockedRunner) else None
        timed = stragglers is not None and len(labels) > 1 and shared and clock is not None
        if timed and _compat.op_determinism_enabled():
            # Op determinism refuses tf.timestamp, which the step sections are measured with.
            logger.info("No straggler report: op determinism is on, and it forbids timestamps.")
            timed = False
        self.clock = clock if timed else None
        if self.clock is not None:
            self.clock.enabled = True
        scores = timed and runner.is_chief
        self.report = StragglerReport(stragglers, summary_dir=summary_dir) if scores else None
        self.straggler_options = stragglers if timed else None
        # Parameter servers: the runner times each worker's calls itself (stuck workers are
        # lost, not hangs of the loop), and its update rates are the straggler report.
        watched = runner.watched_sections if isinstance(runner, SelfWatchingRunner) else ()
        self.unwatched = set(watched)
        rates = runner.worker_update_rates if isinstance(runner, RatedRunner) else None
        self.rates = rates if stragglers is not None and rates is not None else None
        self.rate_options = stragglers if self.rates is not None else None
        self.summary_dir = summary_dir
        self._rate_writer: Any = None
        self._last_rates = time.monotonic()
        self.interval = min(
            watchdog.interval if watchdog else 1e9,
            stragglers.interval if timed or self.rates is not None else 1e9,
        )
        self._current: tuple[str, int, int, float] | None = None
        self._seq = 0
        self._slot = self._clock_slot()
        self._last_window: dict[str, float] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._main = threading.get_ident()
        self._started = time.monotonic()
        self._wall_started = time.time() - 1.0  # hosts' clocks may differ a little
        self._fired = False

    @property
    def stop_requested(self) -> bool:
        """True once the straggler report asks the run to stop for a restart."""
        return self.report is not None and self.report.stop_requested

    def __enter__(self) -> Health:
        if self.interval < 1e9:
            self._thread = threading.Thread(target=self._run, name="tfdist-health", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, kind: Any, error: BaseException | None, tb: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.clock is not None:
            self.clock.enabled = False
        if isinstance(error, RunnerStuckError) and self.watchdog is not None and self._exiting():
            # Parameter servers: a stuck worker no other could stand in for ends the fit.
            logger.error("tfdist watchdog on %s: %s Python stacks follow.", self.label, error)
            _flush()
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            self._exit_stuck()

    def _exiting(self) -> bool:
        return self.watchdog.exit if self.watchdog.exit is not None else not _interactive()

    def _exit_stuck(self) -> None:
        logger.error(
            "tfdist watchdog: exiting with code %d; a launcher with restarts left restarts "
            "the group, %s.",
            STUCK_EXIT_CODE,
            "which resumes from the last backup"
            if self.has_backup
            else "which starts over: this fit has no backup_dir",
        )
        _flush()
        os._exit(STUCK_EXIT_CODE)

    @contextlib.contextmanager
    def section(self, name: str, update: int) -> Iterator[None]:
        """Marks the loop as being in ``name`` at ``update`` (timed against its timeout)."""
        self._seq += 1
        began = time.monotonic()
        self._current = (name, update, self._seq, began)
        try:
            yield
        finally:
            if self.timeouts is not None:
                self.timeouts.observe(name, time.monotonic() - began)
            self._current = None

    def _state(self, now: float, *, final: bool = False) -> dict[str, Any]:
        section, update, seq, began = self._current or ("between sections", -1, self._seq, now)
        state = {
            "seq": seq,
            "section": section,
            "update": update,
            "for": now - began,
            "host": self.host,
            "pid": os.getpid(),
            "published": time.time(),
        }
        if final:
            state["py_function"] = running_py_function()
        return state

    def _run(self) -> None:
        failed = False
        while not self._stop.wait(self.interval):
            try:
                self._round()
            except Exception as error:  # noqa: BLE001 - the store unreachable, say: try again
                if not failed:
                    logger.warning("tfdist health on %s: a round failed (%s).", self.label, error)
                failed = True

    def _round(self) -> None:
        """Publishes this task's state, scores the stragglers, checks for a hang."""
        now = time.monotonic()
        state = self._state(now)
        if self.clock is not None:
            slot = self._clock_slot()
            if slot != self._slot:
                self._slot = slot
                self._last_window = {"window": slot, **self.clock.take()}
            # In every state until the next window: a state without it, published a round
            # later, would hide it from the chief, which scores only once it has every worker's.
            if self._last_window is not None:
                state["clock"] = self._last_window
        self.board.put(f"task/{self.label}", state)
        if self.report is not None:
            self.report.tick(self.board.states())
        if self.rates is not None and now - self._last_rates >= self.rate_options.interval:
            self._last_rates = now
            self._report_rates()
        if self.watchdog is not None and not self._fired:
            self._check(now)

    def _clock_slot(self) -> int:
        """The straggler window under way: wall-clock slots of ``interval`` seconds, the same
        on every task (threads that drift apart would cut their windows at other moments)."""
        interval = self.straggler_options.interval if self.straggler_options else 1e9
        return int(time.time() // interval)

    def _check(self, now: float) -> None:
        # 100 ms: under load a store round trip takes more than a millisecond, and a missed
        # alarm left this task to be stopped before it dumped its stacks (the get waits
        # without the GIL: training goes on meanwhile).
        fired = self.board.get("fired", 100) if self.board.shared else None
        if fired is not None and fired["at"] >= self._wall_started:  # not an earlier fit's
            self._hang(f"{fired['by']} found a hang ({fired['why']})", found_here=False)
            return
        if self._current is None:
            return
        section, update, _, began = self._current
        if section in self.unwatched:
            return
        limit = self.timeouts.timeout(section)
        if now - began > limit:
            why = f"no progress in {section} at update {update} for {now - began:.0f} s"
            mine = {"by": self.label, "why": f"{why}, timeout {limit:.0f} s", "at": time.time()}
            first = self.board.claim("fired", mine)
            if first is not None and first["at"] >= self._wall_started:
                # Another task found it in the same round: it names the stuck task.
                self._hang(f"{first['by']} found a hang ({first['why']})", found_here=False)
                return
            if first is not None:  # an earlier fit's alarm, in this process's store
                self.board.put("fired", mine)
            self._hang(f"{why}; its timeout is {limit:.0f} s ({self._learned(section)})")

    def _report_rates(self) -> None:
        """Parameter servers: each worker's updates per second, logged on request and as scalars."""
        rates = self.rates(log=self.rate_options.log_scores)
        if self.summary_dir is None or not rates:
            return
        import tensorflow as tf

        if self._rate_writer is None:
            self._rate_writer = tf.summary.create_file_writer(self.summary_dir)
        with self._rate_writer.as_default(step=int(time.monotonic() - self._started)):
            for label, rate in rates.items():
                tf.summary.scalar(f"stragglers/update_rate/{label.replace(':', '_')}", rate)
        self._rate_writer.flush()

    def _learned(self, section: str) -> str:
        o = self.watchdog
        return (
            f"learned: {o.factor:g} x the longest {section} so far, within "
            f"[{o.floor:g}, {o.ceiling:g}] s; {o.first:g} s before the first"
        )

    def _hang(self, why: str, *, found_here: bool = True) -> None:
        """Publishes where this task is, dumps its stacks, names the stuck task, exits.

        The stacks come first: once one task exits, the launcher stops the
        others. The task that found the hang names the stuck one at once when
        the states say (a task behind, or silent); else it waits for the
        others' last states (each publishes one as soon as it sees the alarm).
        """
        self._fired = True
        final = self._state(time.monotonic(), final=True)
        logger.error(
            "tfdist watchdog on %s (%s): %s. This task is at %s. Python stacks of all threads "
            "follow.",
            self.label,
            self.host,
            why,
            describe_here(self._main),
        )
        _flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        self.board.put(f"task/{self.label}", final)
        stale_after = max(5.0, 5 * self.interval)
        patience = max(5.0, 2 * self.interval + 0.5)
        # Each task publishes its last state (whether a tf.py_function runs, say) at its next
        # check after the alarm: on a loaded machine, seconds later. The finder waits for it.
        waits = found_here and self.board.shared
        states = self._poll_states(
            lambda st: not waits or conclusive(st, stale_after, time.time()) or self._all_final(st),
            patience,
        )
        logger.error(
            "tfdist watchdog on %s: Stuck: %s.",
            self.label,
            blame(states, stale_after=stale_after, now=time.time()),
        )
        exiting = self._exiting()
        if exiting and self.board.shared:
            # Once a task exits, the launcher stops the rest: wait (within bounds) until every
            # task has dumped its stacks and published its last state. The store still answers
            # meanwhile (its host may be this task).
            self._poll_states(self._all_final, patience)
        if exiting:
            self._exit_stuck()

    def _all_final(self, states: Mapping[str, Mapping[str, Any]]) -> bool:
        """Whether every task published its last state (the one with ``py_function``)."""
        return len(states) == len(self.board.labels) and all(
            "py_function" in s for s in states.values()
        )

    def _poll_states(self, done: Callable[[dict[str, Any]], bool], seconds: float) -> dict:
        """Every task's state, read again every 0.2 s until ``done`` says so or time is up."""
        deadline = time.monotonic() + seconds
        states = self.board.states()
        while not done(states) and time.monotonic() < deadline:
            time.sleep(0.2)
            states = self.board.states()
        return states


def _flush() -> None:
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()


def tensorboard_dir(callbacks: Sequence[Any]) -> str | None:
    """The ``log_dir`` of the fit's ``TensorBoard`` callback, or None without one."""
    found = None
    for callback in callbacks:
        log_dir = getattr(callback, "log_dir", None)
        if type(callback).__name__ == "TensorBoard" and log_dir:
            found = str(log_dir)
    return found


def fit_health(
    runner: Runner,
    *,
    watchdog: WatchdogOptions | None,
    stragglers: StragglerOptions | None,
    callbacks: Sequence[Any],
    has_backup: bool,
) -> Health:
    """The `Health` of one fit; the straggler scalars go beside a TensorBoard's logs."""
    watch = runner.watch if isinstance(runner, WatchingRunner) else None
    if watch is not None:
        # Parameter servers: the same rule times each worker's calls (none: no stuck workers).
        watch.checking = watchdog is not None
        watch.timeouts = watchdog or watch.timeouts
    log_dir = tensorboard_dir(callbacks)
    summary_dir = None if log_dir is None else os.path.join(log_dir, "stragglers")
    return Health(
        runner,
        runner.loop_tasks,
        watchdog=watchdog,
        stragglers=stragglers,
        summary_dir=summary_dir,
        has_backup=has_backup,
    )


def check_health_options(
    watchdog: Any, stragglers: Any, backup: Any
) -> tuple[WatchdogOptions | None, StragglerOptions | None]:
    """Checks the Trainer's ``watchdog`` and ``stragglers`` arguments; returns them."""
    from tfdist.config import invalid_argument

    if watchdog is not None and not isinstance(watchdog, WatchdogOptions):
        raise invalid_argument("watchdog", watchdog, "a tfdist.WatchdogOptions or None")
    if stragglers is not None and not isinstance(stragglers, StragglerOptions):
        raise invalid_argument("stragglers", stragglers, "a tfdist.StragglerOptions or None")
    if stragglers is not None and stragglers.restart_after is not None and backup is None:
        raise invalid_argument(
            "stragglers",
            stragglers,
            "restart_after=None without a backup",
            note="Stopping for a straggler saves a backup to resume from: give backup_dir= too.",
        )
    return watchdog, stragglers
