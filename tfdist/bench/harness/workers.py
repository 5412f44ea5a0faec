"""The program every task of a multi-process benchmark runs (started by ``cluster_run.run_tasks``).

    tfdist launch --workers=2 -- python -m tfdist.bench.harness.workers SPEC.json

It pins this process's threads (and, where the cores allow, its CPUs) before
TensorFlow starts, unless the launcher did (a user's default launch,
``spec["launcher_pins"]``), runs ``spec["kind"]`` (a key of `KINDS`) and
writes its results to ``<out_dir>/<task_type>-<task_id>.json``; their ``threads`` say
what it pinned, and ``preloaded`` whether it was forked from a preloaded Python
(``tfdist bench --preload``).

`KINDS` is a leaf table, as ``tfdist.strategies.registry`` is for strategies:
a kind's module is imported only in the task that runs it, and the worker modules
import what they share from `tfdist.bench.harness.worker_common`, never from here.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable
from typing import Any

from tfdist.bench.harness.worker_common import (
    forked_from_preload,
    launcher_threads,
    pin_threads,
    plan_progress,
    write_result,
)
from tfdist.config import invalid_argument

#: spec["kind"] -> ``"module:function"``, the function ``(spec) -> result | None`` a task runs.
KINDS: dict[str, str] = {
    "scaling": "tfdist.bench.scaling.worker:run_mwms",
    "scaling_ps": "tfdist.bench.scaling.worker:run_ps",
    "allreduce": "tfdist.bench.allreduce.worker:run",
    "stragglers": "tfdist.bench.stragglers.worker:run_mwms",
    "stragglers_ps": "tfdist.bench.stragglers.worker:run_ps",
    "balance": "tfdist.bench.balance.worker:run_mwms",
    "balance_ps": "tfdist.bench.balance.worker:run_ps",
    "balance_ab": "tfdist.bench.balance.worker:run_ab",
    "health": "tfdist.bench.health.worker:run_mwms",
    "time_to_accuracy": "tfdist.bench.time_to_accuracy.worker:run",
    "first_fit": "tfdist.bench.first_fit.worker:run",
    "memory": "tfdist.bench.memory.worker:run",
    "language_model": "tfdist.bench.language_model.worker:run",
}


def resolve(kind: str) -> Callable[[dict[str, Any]], dict[str, Any] | None]:
    """The function that runs tasks of ``kind`` (importing its module).

    Raises:
        ValueError: For a kind not in `KINDS` (Keras-style, listing them).
        ImportError: If the kind's module fails to import (surfaced as is).
    """
    if kind not in KINDS:
        raise invalid_argument("kind", kind, sorted(KINDS))
    module, _, function = KINDS[kind].partition(":")
    return getattr(importlib.import_module(module), function)


def main(argv: list[str]) -> int:
    """Runs the task that the spec file ``argv[1]`` describes; returns the exit code, 0."""
    with open(argv[1]) as f:
        spec = json.load(f)
    # A default launch: the launcher pinned this task already (cluster_run.run_tasks).
    pinned = launcher_threads() if spec.get("launcher_pins") else pin_threads(spec)
    plan_progress(spec)
    result = resolve(spec["kind"])(spec)
    if result is not None:  # ps tasks and PS workers serve and write nothing
        # How the task was set up: its threads and CPUs, and whether it was forked preloaded.
        setup = {**pinned, "preloaded": forked_from_preload()}
        write_result(spec, {**result, "threads": setup})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
