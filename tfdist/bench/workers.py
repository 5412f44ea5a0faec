"""The program every task of a multi-process benchmark runs (started by ``cluster_run.run_tasks``).

    tfdist launch --workers=2 -- python -m tfdist.bench.workers SPEC.json

It pins this process's threads (and, where the cores allow, its CPUs) before
TensorFlow starts, runs ``spec["kind"]`` (a key of :data:`KINDS`) and writes
its results to ``<out_dir>/<task_type>-<task_id>.json``.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Any

from tfdist.bench import timing

# spec["kind"] -> the (module, function) that a task runs; imported only in the task that runs it.
KINDS = {
    "scaling": ("tfdist.bench.scaling_worker", "run_mwms"),
    "scaling_ps": ("tfdist.bench.scaling_worker", "run_ps"),
    "allreduce": ("tfdist.bench.allreduce_worker", "run"),
    "stragglers": ("tfdist.bench.straggler_worker", "run_mwms"),
    "stragglers_ps": ("tfdist.bench.straggler_worker", "run_ps"),
    "health": ("tfdist.bench.health_worker", "run_mwms"),
    "time_to_accuracy": ("tfdist.bench.time_to_accuracy_worker", "run"),
}


def task() -> tuple[str, int]:
    """This process's ``(task_type, task_id)`` from TF_CONFIG."""
    config = json.loads(os.environ["TF_CONFIG"])["task"]
    return config["type"], int(config["index"])


def pin_threads(spec: dict[str, Any]) -> dict[str, Any]:
    """Sets intra/inter-op threads (and CPU affinity when the cores suffice); before any TF work.

    Returns:
        What was set: threads and the CPUs this task may run on.
    """
    import tensorflow as tf

    threads = int(spec["threads_per_worker"])
    task_type, task_id = task()
    # Collectives block an inter-op thread while they wait for the peer: keep at least 2.
    inter = int(spec.get("inter_op_threads") or max(2, threads))
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    if (
        task_type != "ps"
    ):  # a ps serves many RPCs at once; TF's default pool (or tfdist's) is right there
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


class Recorder:
    """Times measurements in a task: wall, own CPU and the whole machine's busy CPU.

    The parent combines the tasks' records: other processes' load during a
    measurement is the machine's busy CPU minus every task's own CPU.
    """

    def __init__(self) -> None:
        self.records: dict[str, list[dict[str, float]]] = {}

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
        return value, took


def write_result(spec: dict[str, Any], result: dict[str, Any]) -> None:
    task_type, task_id = task()
    path = os.path.join(spec["out_dir"], f"{task_type}-{task_id}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)


def main(argv: list[str]) -> int:
    with open(argv[1]) as f:
        spec = json.load(f)
    pinned = pin_threads(spec)
    if spec["kind"] not in KINDS:
        raise ValueError(f"Unknown bench worker kind {spec['kind']!r}")
    module, function = KINDS[spec["kind"]]
    result = getattr(importlib.import_module(module), function)(spec)
    if result is not None:  # ps tasks and PS workers serve and write nothing
        write_result(spec, {**result, "threads": pinned})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
