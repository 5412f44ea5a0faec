"""Which CPUs and TF thread pools each local task of ``tfdist launch`` gets.

Left alone, every task of a local launch sees every core, and TF sizes each task's
thread pools to all of them: two MultiWorkerMirrored workers on a 2-core machine
then fight over both cores. So, by default, the launcher gives each training task
(chief and workers) of this node cores of its own, and TF pools to match:

* the CPUs the launcher may use (``os.sched_getaffinity(0)``) are split evenly, in
  order, among the training tasks; cores that do not divide evenly are nobody's;
* intra-op threads: the task's cores; inter-op threads: as many, at least 2 (a
  collective holds an inter-op thread while it waits for its peers);
* parameter servers and evaluators are not pinned: a ps serves every worker's RPCs
  at once, and an evaluator runs beside training; both see every CPU;
* if the training tasks outnumber the CPUs, no task is pinned.

`pin_layout` decides (pure); `plan_pinning` asks the OS for the CPUs,
logs the choice and hands it to the supervisor. The sandbox helper sets a task's
CPU affinity before it starts the task, so the task and everything it starts
inherit it, restarts included. The thread counts reach TF through
``TF_NUM_INTRAOP_THREADS`` and ``TF_NUM_INTEROP_THREADS``, which TF reads when it
creates its thread pools (an explicit ``tf.config.threading`` call or ConfigProto
takes precedence). No TensorFlow is imported here.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tfdist.cluster import task_label

logger = logging.getLogger(__name__)

TRAINING_TASK_TYPES = ("chief", "worker")
INTRA_OP_ENV = "TF_NUM_INTRAOP_THREADS"
INTER_OP_ENV = "TF_NUM_INTEROP_THREADS"
MIN_INTER_OP_THREADS = 2  # A collective waits for its peers on an inter-op thread.


@dataclass(frozen=True)
class Pinning:
    """The CPUs one task runs on, and its TF thread pools.

    Attributes:
        cpus: The CPU ids the task may run on, ascending.
    """

    cpus: tuple[int, ...]

    @property
    def intra_op_threads(self) -> int:
        return len(self.cpus)

    @property
    def inter_op_threads(self) -> int:
        return max(MIN_INTER_OP_THREADS, len(self.cpus))

    def env(self) -> dict[str, str]:
        """The environment variables through which TF sizes its thread pools."""
        return {INTRA_OP_ENV: str(self.intra_op_threads), INTER_OP_ENV: str(self.inter_op_threads)}

    def __str__(self) -> str:
        """E.g. ``cpus 0-1 (intra-op 2, inter-op 2)``."""
        return (
            f"cpus {cpu_list(self.cpus)} "
            f"(intra-op {self.intra_op_threads}, inter-op {self.inter_op_threads})"
        )


def cpu_list(cpus: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2,5`` (the notation of ``taskset -c`` and cpusets)."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def unpinned_reason(tasks: Sequence[tuple[str, int]], cpus: Sequence[int]) -> str | None:
    """Why no task of ``tasks`` can have cores of its own on ``cpus``, or None if they can."""
    training = sum(task_type in TRAINING_TASK_TYPES for task_type, _ in tasks)
    if training == 0:
        return "no chief or worker task runs here"
    if training > len(cpus):
        return (
            f"{training} training tasks (chief and workers) do not fit on the "
            f"{len(cpus)} CPU(s) this launcher may use ({cpu_list(cpus)})"
        )
    return None


def pin_layout(tasks: Sequence[tuple[str, int]], cpus: Sequence[int]) -> dict[str, Pinning | None]:
    """Splits ``cpus`` evenly among the chief and worker tasks of ``tasks``.

    Args:
        tasks: ``(task_type, task_id)`` of every task on this node. Training
            tasks get consecutive cores in this order.
        cpus: The CPU ids the tasks may use.

    Returns:
        Each task's label (``worker:0``) -> its `Pinning`, or None for a
        task left on every CPU with TF's default pools: parameter servers and
        evaluators always, every task when `unpinned_reason` says why.
    """
    cpus = sorted(set(cpus))
    layout: dict[str, Pinning | None] = {task_label(t, i): None for t, i in tasks}
    if unpinned_reason(tasks, cpus) is not None:
        return layout
    training = [task_label(t, i) for t, i in tasks if t in TRAINING_TASK_TYPES]
    share = len(cpus) // len(training)
    for k, label in enumerate(training):
        layout[label] = Pinning(tuple(cpus[k * share : (k + 1) * share]))
    return layout


def launcher_cpus() -> list[int] | None:
    """The CPUs this process may run on, or None where tasks cannot be pinned (not Linux)."""
    if not (hasattr(os, "sched_getaffinity") and hasattr(os, "sched_setaffinity")):
        return None
    return sorted(os.sched_getaffinity(0))


def plan_pinning(
    tasks: Sequence[tuple[str, int]], *, pin: bool, env: Mapping[str, str] | None = None
) -> dict[str, Pinning]:
    """Chooses and logs each local task's CPUs and thread pools; returns the pinned ones.

    Logs one line per task (``worker:0 -> cpus 0 (intra-op 1, inter-op 2)``), or
    one line saying why no task is pinned.

    Args:
        tasks: ``(task_type, task_id)`` of every task the launcher starts here.
        pin: False to pin nothing (``--pin=false``).
        env: The tasks' base environment (``os.environ`` by default): thread
            counts set there are replaced, with a warning.

    Returns:
        Task label -> `Pinning`, for the pinned tasks only.
    """
    cpus = launcher_cpus()
    if not pin:
        reason = "pin=False (--pin=false, or launch(pin=False))"
    elif cpus is None:
        reason = "setting CPU affinity needs Linux (os.sched_setaffinity)"
    else:
        reason = unpinned_reason(tasks, cpus)
    if reason is not None:
        logger.info("Not pinning tasks to CPUs: %s. Every task sees every CPU.", reason)
        return {}
    layout = pin_layout(tasks, cpus)
    for label, pinning in layout.items():
        logger.info("%s -> %s", label, pinning or "every CPU, TF's default thread pools")
    replaced = sorted(
        k for k in (INTRA_OP_ENV, INTER_OP_ENV) if k in (os.environ if env is None else env)
    )
    if replaced:
        logger.warning(
            "The pinned tasks get their own %s; pass --pin=false (pin=False) to keep yours.",
            " and ".join(replaced),
        )
    return {label: pinning for label, pinning in layout.items() if pinning is not None}
