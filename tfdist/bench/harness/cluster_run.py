"""Runs a benchmark's worker program in real processes through ``tfdist launch``; collects results.

The parent (the ``tfdist bench`` process) writes a JSON *spec*, starts one
process per task with `tfdist.launch.local.launch` (loopback ports, a
private network namespace where the kernel allows it), and every task runs
``python -m tfdist.bench.harness.workers SPEC``. Each task writes
``<out_dir>/<task_type>-<task_id>.json``; the parent reads them back. The
tasks' output goes to a log file, but for their progress lines (one per
measurement, see ``worker_common.report_progress``), which the parent logs.

Threads are pinned before TensorFlow starts in each task: the spec's
``threads_per_worker`` goes into ``OMP_NUM_THREADS``/``TF_NUM_INTRAOP_THREADS``
here and into ``tf.config.threading`` in the task (see ``worker_common.pin_threads``).
Under the bench's ``preload`` option the tasks are forked from one Python that imported
TensorFlow (``tfdist launch --preload``); that Python already has the tasks' environment,
and TF's thread pools start only with a task's first op, after its own threading call.
Forked from an interpreter shared by many launches (``TFDIST_PRELOAD_SERVER``, see
``tfdist.launch.preload``), the tasks' CPU time reaches that interpreter, not this process:
the CPU that other processes took during the launch is then unknown (``others_cpu`` None).
"""

from __future__ import annotations

import json
import logging
import os
import resource
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

from tfdist.bench.harness import common, timing
from tfdist.bench.harness.worker_common import PROGRESS_MARK
from tfdist.config import check_positive_int, invalid_argument

logger = logging.getLogger(__name__)

WORKER_MODULE = "tfdist.bench.harness.workers"


#: The directory that holds the ``tfdist`` package (this file is tfdist/bench/harness/...): first
#: on the tasks' ``PYTHONPATH``, so they import this checkout's tfdist and never a module of
#: tfdist's own directory as a top-level one (``config``, ``logs``).
REPO_ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)


def cores() -> int:
    """The CPU cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def check_task_options(options: Mapping[str, Any], counts: Iterable[str]) -> None:
    """Checks a launched benchmark's ``threads_per_worker`` and its positive-integer ``counts``."""
    threads = options["threads_per_worker"]
    if threads is not None and (
        isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
    ):
        raise invalid_argument(
            "threads_per_worker", threads, "a positive integer or None (cores / workers)"
        )
    for key in counts:
        check_positive_int(key, options[key])


def default_threads(workers: int) -> int:
    """Threads per worker when not given: the cores divided by the workers (at least 1)."""
    return max(1, cores() // max(1, workers))


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def task_env(threads: int | None) -> dict[str, str]:
    """The tasks' environment: this one without TF_CONFIG, threads set, tfdist importable.

    Args:
        threads: Each task's intra-op threads; None leaves the thread variables as
            they are here, for the launcher to set (its default pinning).
    """
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    env["TF_CPP_MIN_LOG_LEVEL"] = env.get("TF_CPP_MIN_LOG_LEVEL", "2")
    if threads is not None:
        # Read by TF and OpenMP when they start, before the task's own tf.config.threading call.
        env.update({"OMP_NUM_THREADS": str(threads), "TF_NUM_INTRAOP_THREADS": str(threads)})
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def read_results(out_dir: str) -> dict[str, Any]:
    """Each task's result file in ``out_dir``, by its name without ``.json`` (``worker-0``)."""
    tasks = {}
    for name in sorted(os.listdir(out_dir)):
        if name.endswith(".json") and name != "spec.json":
            with open(os.path.join(out_dir, name)) as f:
                tasks[name[:-5]] = json.load(f)
    return tasks


class TaskOutput:
    """The tasks' merged output lines: all into ``log``, the progress lines also to the logger."""

    def __init__(self, log: TextIO, label: str) -> None:
        self.log, self.label = log, label

    def write(self, text: str) -> int:
        self.log.write(text)
        _, mark, message = text.partition(PROGRESS_MARK)
        if mark:
            logger.info("bench %s: %s", self.label, message.strip())
        return len(text)

    def flush(self) -> None:
        self.log.flush()


def _log_self_pinning(spec: Mapping[str, Any]) -> None:
    """Says what the launcher's "Not pinning" line leaves out: each task pins itself."""
    logger.info(
        "bench %s: each task sets its own threads (%s intra-op) and %s, so the launcher "
        "pins nothing (launch(pin=False))",
        spec["kind"],
        spec["threads_per_worker"],
        "its own cores, when they fit" if spec.get("pin_cores") else "shares every CPU",
    )


def run_tasks(
    spec: Mapping[str, Any],
    *,
    workers: int,
    ps: int = 0,
    chief: bool = False,
    timeout: float = 900.0,
    default_launch: bool = False,
    extra_env: Mapping[str, str] | None = None,
    preload: bool = True,
) -> dict[str, Any]:
    """Launches the tasks on ``spec`` and returns their results.

    Args:
        spec: JSON-able; ``spec["kind"]`` names the worker program
            (see ``tfdist.bench.harness.workers``), ``spec["threads_per_worker"]`` the
            intra-op threads of each task (unless ``default_launch``).
        workers: Worker processes.
        ps: Parameter-server processes.
        chief: Whether to add a chief process.
        timeout: Seconds after which the launcher kills every task.
        default_launch: Launch as a user's default ``tfdist launch`` does: the
            launcher pins each training task to its own cores and sizes its TF
            thread pools (``tfdist.launch.pinning``), no thread variables are set
            here, and the tasks leave their threads alone (``spec["launcher_pins"]``).
        extra_env: Variables added to the tasks' environment.
        preload: Fork the tasks from the bench's preloaded interpreter where it has one;
            False starts each afresh (for variables TF reads when it starts).

    Returns:
        ``{"tasks": {"worker-0": {...}, ...}, "launch_seconds": s, "others_cpu": c}``
        where ``others_cpu`` is the CPU (in cores) that processes other than
        this one and its tasks took during the whole launch (None where unknown).

    Raises:
        RuntimeError: If a task failed (with the tail of the tasks' output).
    """
    from tfdist.launch.local import launch
    from tfdist.launch.preload import shared_server

    preloaded = common.options().get("preload", ()) if preload else ()
    env = {
        **task_env(None if default_launch else int(spec["threads_per_worker"])),
        **(extra_env or {}),
    }
    # Tasks forked by a shared interpreter are not this process's children: their CPU is unknown.
    tasks_cpu_known = not (preloaded and shared_server(sys.executable, preloaded, env)[0])
    if not default_launch:
        _log_self_pinning(spec)
    with tempfile.TemporaryDirectory(prefix="tfdist-bench-") as out_dir:
        spec = {**spec, "out_dir": out_dir, "launcher_pins": default_launch}
        spec_path = os.path.join(out_dir, "spec.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        log_path = os.path.join(out_dir, "tasks.log")
        watch = timing.Stopwatch()
        children = _children_cpu_seconds()
        watch.start()
        with open(log_path, "w") as log:
            code = launch(
                [sys.executable, "-m", WORKER_MODULE, spec_path],
                workers=workers,
                ps=ps,
                chief=chief,
                env=env,
                output=TaskOutput(log, f"{spec['kind']} ({workers} worker(s), {ps} ps)"),
                timeout=timeout,
                # Else each task pins itself as its spec says (worker_common.pin_threads).
                pin=default_launch,
                preload=preloaded,
            )
        took = watch.stop()
        children = _children_cpu_seconds() - children
        if code != 0:
            _raise_failed(spec, workers, ps, code, log_path)
        tasks = read_results(out_dir)
    others = (
        (took.others_cpu_seconds - children) / took.seconds
        if took.others_cpu_seconds is not None and tasks_cpu_known
        else None
    )
    return {
        "tasks": tasks,
        "launch_seconds": round(took.seconds, 2),
        "others_cpu": None if others is None else round(max(others, 0.0), 2),
    }


def _raise_failed(spec: Mapping[str, Any], workers: int, ps: int, code: int, log: str) -> None:
    """A failed launch: its exit code, any out-of-memory lines (a task that ran out is often
    not the last to report) and the last 40 lines of the tasks' output."""
    with open(log) as f:
        lines = f.readlines()
    oom = [line for line in lines if "OOM when allocating" in line][:2]
    tail = "".join(oom + lines[-40:])
    raise RuntimeError(
        f"bench tasks ({spec['kind']}, {workers} workers, {ps} ps) exited {code}:\n{tail}"
    )


def machine() -> dict[str, Any]:
    """What the figures were measured on: CPU model and flags, cores, load."""
    from tfdist.bench.in_process.bf16_vs_fp32 import cpu_features

    info = cpu_features()
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {
        "cpu": info,
        "cpu_count": os.cpu_count(),
        "cores_usable": cores(),
        "loadavg": load,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def merge_options(
    defaults: Mapping[str, Any], quick_overrides: Mapping[str, Any], overrides: dict[str, Any]
) -> dict[str, Any]:
    """A multi-process benchmark's options: defaults, then ``--quick``'s, then the caller's.

    Raises:
        ValueError: For an option the benchmark does not take (Keras-style, naming it).
    """
    quick = overrides.pop("quick", False)
    unknown = set(overrides) - set(defaults)
    if unknown:
        raise invalid_argument("option", sorted(unknown)[0], sorted(defaults))
    return {**defaults, **(quick_overrides if quick else {}), **overrides}
