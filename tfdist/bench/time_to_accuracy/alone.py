"""Side ``alone`` of the 2-worker launch: one worker measured in the same launch as the pair.

This host's speed drifts between launches (a quiet launch pair gave 1.93 and the next 1.39 for
the same ratio, docs/benchmarks.md), so a 2-worker side over the 1-worker launch's compares
fits run minutes apart. With ``parent.run(alone=True)`` the 2-worker launch also runs side
``alone``: worker 0 trains the task's synchronous Trainer by itself on
``tfdist.make_strategy("one_device")`` (the same model, optimizer, seed, per-worker batch and
``worker.fit_to_target`` as the 1-worker launch's ``none`` side, at the base rate), while
worker 1 waits without using CPU: it sleep-polls a file worker 0 writes when its fit ends
(`POLL_SECONDS`). Then both re-join through one all-reduce of the launch's MultiWorkerMirrored
strategy (`Alone.rejoin`) before the next side. It alternates with the 2-worker sides over
``repeats`` as every side does (the worker runs it last in the even repeats, first in the odd
ones). Before the timed fits, one untimed one-epoch fit of it, as the 1-worker launch has.

Worker 1's wait is recorded under the side's name (its CPU then counts as the launch's own,
not another process's); `waits` reports it. The summary's ratios over it are
`same_launch_ratios`: ``<task>_<side>_examples_per_s_same_launch_ratio`` and
``<task>_<side>_time_same_launch_ratio``, each 2-worker side's median over ``alone``'s.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

import tensorflow as tf

import tfdist
from tfdist.bench.harness import timing

#: The side's name (in ``rules_of``, the records and the summary).
SIDE = "alone"
#: Seconds between worker 1's looks at the file that ends its wait (its wake-ups are its CPU).
POLL_SECONDS = 0.05

T = TypeVar("T")


class Alone:
    """Side `SIDE` of one benchmark task on this process of the 2-worker launch.

    Args:
        strategy: The launch's MultiWorkerMirrored strategy.
        spec: The launch's spec (``out_dir``, shared by the tasks; ``launch_timeout``).
        name: The benchmark task.
        lead: Whether this process trains (worker 0) or waits.
    """

    def __init__(self, strategy: Any, spec: dict[str, Any], name: str, lead: bool) -> None:
        self.strategy, self.name, self.lead = strategy, name, lead
        self.path = os.path.join(spec["out_dir"], f"alone-{name}-{{}}")
        self.timeout = float(spec["launch_timeout"])
        self.calls = 0
        self._one_device: Any = None
        self._barrier: Any = None

    def one_device(self) -> Any:
        """The one-device strategy worker 0 trains on, made once."""
        if self._one_device is None:
            self._one_device = tfdist.make_strategy("one_device")
        return self._one_device

    def run(self, fit: Callable[[], T], recorder: Any = None) -> T | None:
        """``fit()`` on worker 0 (None on worker 1, which waits for it); then both re-join.

        Args:
            fit: Worker 0's fit (it records itself).
            recorder: Worker 1 records its wait in it under ``<task>/alone`` (None: untimed).
        """
        path = self.path.format(self.calls)
        self.calls += 1
        value = None
        if self.lead:
            value = fit()
            with open(path, "w"):
                pass
        elif recorder is None:
            self._wait(path)
        else:
            recorder.measure(f"{self.name}/{SIDE}", lambda: self._wait(path))
        self.rejoin()
        return value

    def _wait(self, path: str) -> None:
        deadline = time.monotonic() + self.timeout
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"bench time_to_accuracy: worker 0's {SIDE!r} fit did not end within "
                    f"{self.timeout:g} s (launch_timeout)"
                )
            time.sleep(POLL_SECONDS)

    def rejoin(self) -> None:
        """Both workers meet in one all-reduce of the launch's strategy (a barrier).

        Raises:
            RuntimeError: If the all-reduce's sum is not the number of replicas.
        """
        if self._barrier is None:
            strategy = self.strategy

            def one() -> Any:
                return tf.constant(1.0)

            self._barrier = tf.function(
                lambda: strategy.reduce("SUM", strategy.run(one), axis=None)
            )
        total = float(self._barrier())
        if total != self.strategy.num_replicas_in_sync:
            raise RuntimeError(
                f"bench time_to_accuracy: the {SIDE!r} barrier summed {total}, expected "
                f"{self.strategy.num_replicas_in_sync} (one per replica)"
            )


def waits(processes: dict[str, Any], name: str, lead: str = "worker-0") -> dict[str, Any]:
    """Every other task's waits during the lead's timed `SIDE` fits of task ``name``: their
    seconds and CPU seconds (``{task: {"seconds": [...], "cpu_seconds": [...]}}``)."""
    key = f"{name}/{SIDE}"
    return {
        task: {
            field: [r[field] for r in process["records"].get(key, [])]
            for field in ("seconds", "cpu_seconds")
        }
        for task, process in processes.items()
        if task != lead
    }


def same_launch_ratios(
    out: dict[str, Any], name: str, sides: dict[str, Any], labels: dict[str, str]
) -> dict[str, Any]:
    """Each 2-worker side's ratios over `SIDE`'s of task ``name`` into ``out``, with words.

    ``<name>_<label>_examples_per_s_same_launch_ratio``: steady examples/s (after the first
    epoch) over ``alone``'s; ``<name>_<label>_time_same_launch_ratio``: seconds to the target
    over ``alone``'s (None when either did not reach it): medians, each side's own. ``label``
    is ``labels``' for a synchronous rule (``no_scaling``), else the side's name.

    Args:
        out: The results, with their ``words``.
        name: The benchmark task.
        sides: The 2-worker launch's sides (`SIDE` among them, or nothing is added).
        labels: The synchronous rules' labels.

    Returns:
        Per side, the ratios of each repeat's fit over the same repeat's ``alone`` fit
        (``{label: {"examples_per_s": [...], "time": [...]}}``; None where unknown).
    """
    alone = sides.get(SIDE)
    if alone is None:
        return {}
    ratio = timing.ratio_or_none
    figures = {"examples_per_s": "steady_examples_per_s", "time": "seconds_to_target"}
    per_repeat: dict[str, Any] = {}
    for side, summary in sides.items():
        if side == SIDE:
            continue
        label = labels.get(side, side)
        per_repeat[label] = {}
        for figure, field in figures.items():
            key = f"{name}_{label}_{figure}_same_launch_ratio"
            out[key] = ratio(summary.get(field), alone.get(field))
            out["words"][key] = (
                f"{name}: 2 workers on {side} / worker 0 alone on one_device in the same "
                + ("launch, steady training examples/s" if figure == "examples_per_s" else
                   "launch, time to accuracy")
            )  # fmt: skip
            pairs = zip(summary.get("runs", []), alone.get("runs", []))
            per_repeat[label][figure] = [ratio(a.get(field), b.get(field)) for a, b in pairs]
    return per_repeat
