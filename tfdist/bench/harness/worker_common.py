"""What every task of a multi-process benchmark shares: who it is, its threads, its records.

A leaf of the bench's task programs: `tfdist.bench.harness.workers` (the program
every task runs) and each worker module (``scaling_worker``, ``allreduce_worker``,
...) import it, and it imports none of them, so the task programs form no import circle.

Progress: the lead task (the chief, or worker 0 without one) prints one line per
measurement to stderr, ``tfdist-bench-progress: trainer 2/5 (3.1 s)``, which
``cluster_run.run_tasks`` picks out of the tasks' output and logs in the parent.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from tfdist.bench.harness import timing

#: Marks a task's progress line in its output (``cluster_run`` logs the lines that carry it).
PROGRESS_MARK = "tfdist-bench-progress: "

# Measurements per name that progress lines count against: spec["repeats"] (``plan_progress``).
_planned_repeats: list[int | None] = [None]


def task() -> tuple[str, int]:
    """This process's ``(task_type, task_id)`` from TF_CONFIG."""
    config = json.loads(os.environ["TF_CONFIG"])["task"]
    return config["type"], int(config["index"])


def is_lead_task() -> bool:
    """Whether this task reports progress: the chief, or worker 0 in a cluster without one (or
    this process, outside a cluster: a worker program run in-process)."""
    if "TF_CONFIG" not in os.environ:
        return True
    cluster = json.loads(os.environ["TF_CONFIG"]).get("cluster", {})
    task_type, task_id = task()
    if "chief" in cluster:
        return task_type == "chief"
    return task_type == "worker" and task_id == 0


def plan_progress(spec: Mapping[str, Any]) -> None:
    """Sets the measurements per name that progress lines count against (``spec["repeats"]``)."""
    repeats = spec.get("repeats")
    _planned_repeats[0] = int(repeats) if repeats is not None else None


def report_progress(message: str) -> None:
    """Prints one progress line to stderr, on the lead task only (see the module docstring)."""
    if is_lead_task():
        print(PROGRESS_MARK + message, file=sys.stderr, flush=True)


def pin_threads(spec: dict[str, Any]) -> dict[str, Any]:
    """Sets intra/inter-op threads (and CPU affinity when the cores suffice); before any TF work.

    Unlike ``tfdist.launch.pinning`` (which splits the launcher's CPUs evenly and
    sizes the pools from them), a bench task gets a fixed ``threads_per_worker``
    from its spec, the same for every worker count (weak scaling), and sets it
    with ``tf.config.threading``; its launcher is started with ``pin=False``.

    Returns:
        What was set: threads and the CPUs this task may run on.
    """
    import tensorflow as tf

    threads = int(spec["threads_per_worker"])
    task_type, task_id = task()
    # Collectives block an inter-op thread while they wait for the peer: keep at least 2.
    inter = int(spec.get("inter_op_threads") or max(2, threads))
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    if task_type != "ps":  # a ps serves many RPCs at once; TF's default pool (or tfdist's) is right
        tf.config.threading.set_inter_op_parallelism_threads(inter)
    cpus = None
    available = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    slots = int(spec.get("num_pinned_tasks", 0))
    if (
        spec.get("pin_cores")
        and task_type in ("worker", "chief")
        and slots * threads <= len(available)
    ):
        # Each worker gets its own cores, so the workers do not compete for one (weak scaling).
        index = task_id + (1 if task_type == "worker" and spec.get("chief_pinned") else 0)
        cpus = available[index * threads : (index + 1) * threads]
        os.sched_setaffinity(0, cpus)
    return {
        "intra_op_threads": threads,
        "inter_op_threads": inter if task_type != "ps" else None,
        "cpus": cpus,
    }


def launcher_threads() -> dict[str, Any]:
    """What the launcher's default pinning gave this task; sets nothing (``spec["launcher_pins"]``).

    ``tfdist launch`` pins each chief and worker task to its own cores where they fit
    and passes its TF thread pools in ``TF_NUM_INTRAOP_THREADS``/``TF_NUM_INTEROP_THREADS``
    (``tfdist.launch.pinning``); a task of a default launch leaves both as they are.

    Returns:
        The thread counts the launcher set (None: TF's defaults) and the CPUs this task may
        run on (None where the OS cannot tell).
    """

    def env_int(name: str) -> int | None:
        value = os.environ.get(name)
        return int(value) if value else None

    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {
        "intra_op_threads": env_int("TF_NUM_INTRAOP_THREADS"),
        "inter_op_threads": env_int("TF_NUM_INTEROP_THREADS"),
        "cpus": cpus,
        "pinned_by": "launcher",
    }


class Recorder:
    """Times measurements in a task: wall, own CPU and the whole machine's busy CPU.

    The parent combines the tasks' records: other processes' load during a
    measurement is the machine's busy CPU minus every task's own CPU. Each
    measurement reports one progress line, ``name k/n (seconds)``.

    Args:
        planned: Measurements planned per name, for the names not measured
            ``spec["repeats"]`` times (e.g. a calibration).
    """

    def __init__(self, planned: Mapping[str, int] | None = None) -> None:
        self.records: dict[str, list[dict[str, float]]] = {}
        self.planned = dict(planned or {})

    def measure(self, name: str, fn: Any) -> tuple[Any, timing.Timing]:
        watch = timing.Stopwatch()
        busy = timing.busy_cpu_seconds()
        watch.start()
        value = fn()
        took = watch.stop()
        after = timing.busy_cpu_seconds()
        self.records.setdefault(name, []).append(
            {
                "seconds": took.seconds,
                "cpu_seconds": took.cpu_seconds,
                "busy_cpu_seconds": None if busy is None or after is None else after - busy,
            }
        )
        self._report(name, took.seconds)
        return value, took

    def _report(self, name: str, seconds: float) -> None:
        done, planned = len(self.records[name]), self.planned.get(name, _planned_repeats[0])
        count = f"{done}/{planned}" if planned is not None and done <= planned else str(done)
        report_progress(f"{name} {count} ({seconds:.1f} s)")


def forked_from_preload(pid: int | str = "self") -> bool:
    """Whether this task (or process ``pid``) was forked from ``tfdist launch --preload``'s Python.

    A fork keeps its parent's command line, so such a task's is still the preloaded Python's
    (``python -m tfdist.launch._zygote ...``, or ``python -m tfdist.launch.preload ...`` for
    one shared by many launches). Its own, not its parent's: the parent's pid may be one of
    the sandbox's PID namespace, which this ``/proc`` does not show.
    """
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        # A launch's own (``_zygote``), or one shared by many launches (``preload``).
        return b"tfdist.launch._zygote" in cmdline or b"tfdist.launch.preload\0" in cmdline
    except OSError:  # not Linux
        return False


def write_result(spec: dict[str, Any], result: dict[str, Any]) -> None:
    """Writes this task's ``result`` to ``<out_dir>/<task_type>-<task_id>.json`` (atomically)."""
    task_type, task_id = task()
    path = os.path.join(spec["out_dir"], f"{task_type}-{task_id}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)
