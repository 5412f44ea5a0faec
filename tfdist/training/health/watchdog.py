"""The progress watchdog's parts: its options, learned timeouts, and who to blame for a hang.

Every task of a ``Trainer.fit`` goes through the same sections in the same
order (``startup``, then per call ``update``, ``callbacks``, ``vote``, and
``evaluate``/``backup`` where due): the loop runs in lockstep. A section that
lasts longer than its timeout is a hang. The timeout of a section is learned
from how long that section took so far in this fit (`LearnedTimeouts`);
before it has been seen once, it includes tracing or a first save, so it gets
the large ``first`` allowance.

On a hang each task dumps its Python stacks and says where it is
(`describe_here`); `blame` reads every task's published state and
names the stuck one: the task behind the others in the lockstep sequence, else
the one running a ``tf.py_function`` (an input pipeline's Python), else one
that stopped reporting. Then the tasks exit with
`tfdist.config.STUCK_EXIT_CODE`, which ``tfdist launch``, the Slurm
script and Ray's ``FailureConfig`` treat as a restartable failure. The run
resumes from its last backup.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Mapping
from typing import Any

from tfdist.config import WatchdogOptions

#: The sections of a fit, in the order a call goes through them.
SECTIONS = (
    "startup",
    "input",
    "metrics",
    "update",
    "callbacks",
    "vote",
    "evaluate",
    "backup",
    "epoch callbacks",
)


class LearnedTimeouts:
    """Per section: the durations seen so far in this fit, and the timeout they imply.

    The first occurrence of a section (tracing, a first save) is left out of
    the learned maximum once a second one was seen, so that a slow first trace
    does not make every later timeout long.
    """

    def __init__(self, options: WatchdogOptions) -> None:
        self.options = options
        self._first: dict[str, float] = {}
        self._longest: dict[str, float] = {}

    def observe(self, section: str, seconds: float) -> None:
        """Notes that ``section`` took ``seconds``."""
        if section not in self._first:
            self._first[section] = seconds
        else:
            self._longest[section] = max(self._longest.get(section, 0.0), seconds)

    def timeout(self, section: str) -> float:
        """Seconds ``section`` may last now."""
        if section not in self._first:
            return self.options.first
        return self.options.timeout(self._longest.get(section, self._first[section]))


def running_py_function() -> bool:
    """Whether a thread of this process runs a ``tf.py_function`` (an input pipeline's Python)."""
    return any(
        frame.f_code.co_filename.endswith("script_ops.py")
        for top in sys._current_frames().values()
        for frame, _ in traceback.walk_stack(top)
    )


def describe_here(main_thread_id: int) -> str:
    """Where this process's main thread is: its innermost frame outside TF and Keras."""
    frame = sys._current_frames().get(main_thread_id)
    for f, line in traceback.walk_stack(frame):
        name = f.f_code.co_filename
        if not any(part in name for part in ("/tensorflow/", "/keras/", "/threading.py")):
            return f"{name}:{line} in {f.f_code.co_name}"
    return "inside TensorFlow"


def conclusive(states: Mapping[str, Mapping[str, Any]], stale_after: float, now: float) -> bool:
    """Whether the states already name a stuck task: one is behind, silent or in Python."""
    if len(states) < 2:
        return True
    ahead = max(s["seq"] for s in states.values())
    return any(
        s["seq"] < ahead or now - s["published"] > stale_after or s.get("py_function")
        for s in states.values()
    )


def blame(states: Mapping[str, Mapping[str, Any]], *, stale_after: float, now: float) -> str:
    """Names the stuck task(s) from every task's published state (see `health`).

    Args:
        states: Task label -> its last published state (``seq``, ``section``,
            ``update``, ``for``, ``host``, ``published``, ``py_function``).
        stale_after: Seconds without a publication after which a task is
            taken to be frozen or gone.
        now: The current wall time (``time.time()``).

    Returns:
        One sentence naming the stuck task(s) and why.
    """
    if not states:
        return "no task's state could be read (the store's task, the chief, may be gone)"
    if len(states) == 1:
        (t, s), *_ = states.items()
        python = " (a tf.py_function runs: its input pipeline's Python, say)"
        return (
            f"{t} on {s['host']} is stuck in {s['section']} at update {s['update']} for "
            f"{s['for']:.0f} s{python if s.get('py_function') else ''}"
        )
    stale = [t for t, s in states.items() if now - s["published"] > stale_after]
    if stale:
        return ", ".join(
            f"{t} on {states[t]['host']} stopped reporting {now - states[t]['published']:.0f} s "
            f"ago in {states[t]['section']} at update {states[t]['update']} (frozen or gone)"
            for t in sorted(stale)
        )
    ahead = max(s["seq"] for s in states.values())
    behind = sorted(t for t, s in states.items() if s["seq"] < ahead)
    if behind:
        waiting = sorted({s["section"] for s in states.values() if s["seq"] == ahead})
        return "; ".join(
            f"{t} on {states[t]['host']} is stuck in {states[t]['section']} at update "
            f"{states[t]['update']} for {states[t]['for']:.0f} s, while the others wait in "
            f"{'/'.join(waiting)}"
            for t in behind
        )
    python = sorted(t for t, s in states.items() if s.get("py_function"))
    section, update = next(iter(states.values()))["section"], next(iter(states.values()))["update"]
    if python:
        return ", ".join(
            f"{t} on {states[t]['host']} is stuck in a tf.py_function (its input pipeline's "
            f"Python, say) in {section} at update {update}"
            for t in python
        )
    return (
        f"every task waits in {section} at update {update}: none is behind, so the stall is "
        "inside TensorFlow (a collective, an input pipeline or a file read); see the stacks"
    )


#: The Trainer's default watchdog.
DEFAULT_WATCHDOG = WatchdogOptions()
