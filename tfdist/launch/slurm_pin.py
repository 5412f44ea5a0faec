"""Each Slurm task on CPUs of its own, with TF thread pools to match, as ``tfdist launch`` does.

``srun`` gives every task of a node every CPU of the allocation unless the cluster
binds tasks (``TaskPlugin=task/affinity`` or ``task/cgroup`` with ``--cpu-bind``),
and TF then sizes each task's pools to all of them: two workers of a node fight for
the same cores. So the script ``tfdist manifest slurm`` writes runs each task as
``srun ... python -m tfdist.launch.slurm_pin -- COMMAND``. This module:

* reads the task's node and role from the SLURM_* variables, as
  `tfdist.cluster.from_slurm` does (`tfdist.cluster.slurm.node_tasks`);
* if Slurm bound the task itself (``SLURM_CPU_BIND_TYPE`` names a binding), keeps the
  CPUs Slurm gave it and sizes TF's pools to them;
* otherwise splits the CPUs the task may use among the chief and worker tasks of its node,
  in rank order, as `tfdist.launch.pinning.pin_layout` splits a local launch's;
  parameter servers and evaluators keep every CPU and TF's default pools;
* sets its CPU affinity and ``TF_NUM_INTRAOP_THREADS``/``TF_NUM_INTEROP_THREADS``, prints
  one line saying what it chose, and replaces itself with ``COMMAND`` (``exec``), which
  inherits both.

``tfdist manifest slurm --pin=false`` writes the script without it. No TensorFlow is
imported here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from tfdist.cluster import task_label
from tfdist.cluster.slurm import node_tasks
from tfdist.launch.pinning import (
    INTER_OP_ENV,
    INTRA_OP_ENV,
    Pinning,
    cpu_list,
    launcher_cpus,
    pin_layout,
    unpinned_reason,
)


def slurm_bound(environ: Mapping[str, str]) -> bool:
    """Whether Slurm itself bound this task to CPUs (``srun --cpu-bind`` took effect).

    ``SLURM_CPU_BIND_TYPE`` is e.g. ``mask_cpu:`` or ``cores,`` when it did, and unset,
    empty or ``none`` (``quiet,none``) when it did not.
    """
    parts = {p for p in environ.get("SLURM_CPU_BIND_TYPE", "").strip().lower().split(",") if p}
    return bool(parts - {"quiet", "verbose"}) and "none" not in parts


def task_pinning(
    environ: Mapping[str, str], cpus: Sequence[int]
) -> tuple[str, Pinning | None, str]:
    """This Slurm task's label, its `Pinning` (None: every CPU), and why.

    Args:
        environ: The task's environment (SLURM_* as ``srun`` sets them).
        cpus: The CPUs the task may run on (its affinity).

    Raises:
        ValueError: If a Slurm variable is missing or malformed (as `from_slurm` says).
    """
    tasks, me = node_tasks(environ)
    label = task_label(*me)
    if slurm_bound(environ):
        return label, Pinning(tuple(sorted(cpus))), "the CPUs Slurm bound it to"
    reason = unpinned_reason(tasks, cpus)
    if reason is not None:
        return label, None, reason
    pinning = pin_layout(tasks, cpus)[label]
    if pinning is None:
        return label, None, "parameter servers and evaluators see every CPU"
    share = sum(t in ("chief", "worker") for t, _ in tasks)
    return label, pinning, f"its share of CPUs {cpu_list(cpus)} among {share} training tasks"


def main(argv: Sequence[str]) -> int:
    """``python -m tfdist.launch.slurm_pin -- COMMAND...``: pins this task, then execs COMMAND."""
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        print(
            "tfdist.launch.slurm_pin: Expected `-- COMMAND...` after the module. Received: "
            f"{list(argv)}.",
            file=sys.stderr,
        )
        return 2
    command = list(argv[argv.index("--") + 1 :])
    cpus = launcher_cpus()
    if cpus is None:
        _say(f"task {os.environ.get('SLURM_PROCID', '?')}: not pinned (needs Linux)")
    else:
        label, pinning, why = task_pinning(os.environ, cpus)
        if pinning is None:
            _say(f"slurm task {label}: every CPU, TF's default thread pools ({why})")
        else:
            _pin(label, pinning, why)
    sys.stdout.flush()
    os.execvp(command[0], command)
    return 127  # Not reached: execvp raises if it cannot run COMMAND.


def _pin(label: str, pinning: Pinning, why: str) -> None:
    replaced = [k for k in (INTRA_OP_ENV, INTER_OP_ENV) if k in os.environ]
    os.sched_setaffinity(0, pinning.cpus)
    os.environ.update(pinning.env())
    _say(f"slurm task {label} -> {pinning}: {why}")
    if replaced:
        _say(
            f"slurm task {label}: replaced {' and '.join(replaced)}; write the script with "
            "--pin=false to keep yours"
        )


def _say(line: str) -> None:
    print(f"tfdist: {line}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
