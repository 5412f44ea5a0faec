"""``tfdist manifest slurm``: an sbatch script that runs one process per Slurm task.

    tfdist manifest slurm --nnodes=2 --workers=4 --output=job.sbatch -- \\
        tfdist train --strategy=multi_worker

With ``--min_nodes=1 --nnodes=4`` the job asks for ``--nodes=1-4``: Slurm starts
it on as many of up to 4 nodes as it can grant (at least 1), and a requeued job
may get another count. Tasks build the cluster from what they got, and a
backup resumes on it with the same global batch (docs/launch.md, "Resuming on another
world size").

Nothing here talks to Slurm or imports TensorFlow; `slurm_script` returns
the script's text. ``srun`` sets SLURM_* variables in each task and
`tfdist.cluster.from_slurm` turns them into a cluster (what
``make_strategy`` reads): task SLURM_PROCID is worker SLURM_PROCID, or takes its
role by rank from TFDIST_SLURM_ROLES (chief, then ps, then workers), and the
k-th task on a node listens on port ``slurm_port_base(SLURM_JOB_ID) + k``.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tfdist.cluster import SLURM_PORT_BASE, SLURM_PORT_BLOCKS, SLURM_PORTS_PER_JOB
from tfdist.config import (
    PREEMPTED_EXIT_CODE,
    STUCK_EXIT_CODE,
    check_non_negative_int,
    check_positive_int,
    invalid_argument,
)
from tfdist.launch.tasks import check_command

_SLURM_TIME = re.compile(
    r"[0-9]+(:[0-9]{1,2}){0,2}|[0-9]+-[0-9]{1,2}(:[0-9]{1,2}){0,2}|(?i:unlimited|infinite)"
)


def slurm_script(
    command: Sequence[str],
    *,
    nnodes: int = 1,
    workers: int | None = None,
    ntasks: int | None = None,
    ps: int = 0,
    chief: bool = False,
    partition: str | None = None,
    time: str | None = None,
    job_name: str = "tfdist",
    max_restarts: int = 0,
    min_nodes: int | None = None,
    pin: bool = True,
) -> str:
    """Returns an sbatch script that runs ``command`` once per Slurm task.

    ``srun`` starts the tasks; each builds its cluster from the SLURM_*
    variables (`tfdist.cluster.from_slurm`). Without ``chief``/``ps``
    every task is a MultiWorkerMirrored worker (rank 0 is the chief). With
    them, the script exports ``TFDIST_SLURM_ROLES`` and ranks take roles in
    order: the chief, then the ps, then the workers; the job ends when the
    chief does, with its exit code (ps and workers serve until then).

    With ``max_restarts``, the job is requeued when its tasks exit with code
    75 (they saved a backup after SIGTERM, e.g. ``scancel --signal=TERM JOB``
    or ``sbatch --signal=TERM@120``), at most that many times; run
    ``tfdist train --backup_dir=DIR`` so that the next run resumes there.

    Args:
        command: The program and its arguments, run by ``srun`` on every task.
        nnodes: The number of nodes (``#SBATCH --nodes``).
        workers: Workers per node; the default without ``ntasks`` is 2.
        ntasks: Total tasks (chief, ps and workers), a multiple of ``nnodes``;
            instead of ``workers``.
        ps: Parameter-server tasks (needs ``chief``).
        chief: Whether rank 0 is a chief (the parameter-server coordinator).
        partition: The Slurm partition, or None for the cluster's default.
        time: The job's time limit in Slurm's syntax (``--time``), e.g.
            ``"30"``, ``"01:00:00"`` or ``"1-12:00:00"``; None for the default.
        job_name: The job's name (``#SBATCH --job-name``).
        max_restarts: Requeues after a preemption (exit code 75); 0 for none.
        min_nodes: The fewest nodes to start on (``#SBATCH --nodes=min_nodes-nnodes``),
            or None for exactly ``nnodes``. Each run trains on the nodes Slurm granted,
            ``workers`` tasks on each; MultiWorkerMirrored only (no ``chief``/``ps``).
        pin: Run each task through `tfdist.launch.slurm_pin`, which gives each chief
            and worker of a node its own CPUs and TF thread pools to match (the CPUs Slurm
            bound it to, if it did). False: every task sees every CPU, TF's default pools.

    Returns:
        The script's text; submit it with ``sbatch FILE``.

    Raises:
        ValueError: On a bad argument, or tasks that do not divide into the roles.
    """
    return sbatch_script(
        SlurmJob(
            command=command,
            nnodes=nnodes,
            workers=workers,
            ntasks=ntasks,
            ps=ps,
            chief=chief,
            partition=partition,
            time=time,
            job_name=job_name,
            max_restarts=max_restarts,
            min_nodes=min_nodes,
            pin=pin,
        )
    )


@dataclass(frozen=True)
class SlurmJob:
    """One Slurm job, whole: `slurm_script`'s arguments (see it for each)."""

    command: Sequence[str]
    nnodes: int = 1
    workers: int | None = None
    ntasks: int | None = None
    ps: int = 0
    chief: bool = False
    partition: str | None = None
    time: str | None = None
    job_name: str = "tfdist"
    max_restarts: int = 0
    min_nodes: int | None = None
    pin: bool = True


def sbatch_script(job: SlurmJob) -> str:
    """`slurm_script` with its arguments as one `SlurmJob`: the checked script's text."""
    command = check_command(job.command)
    if not isinstance(job.pin, bool):
        raise invalid_argument("pin", job.pin, "True or False")
    if job.pin:
        command = _pinned(command)
    nnodes, ps, chief, max_restarts = job.nnodes, job.ps, job.chief, job.max_restarts
    check_positive_int("nnodes", nnodes)
    _check_ps(ps, chief=chief)
    check_non_negative_int("max_restarts", max_restarts)
    nodes = _node_range(job.min_nodes, nnodes, chief=chief, ntasks=job.ntasks)
    ntasks = _total_tasks(nnodes, job.workers, job.ntasks, ps=ps, chief=chief)
    per_node = _tasks_per_node(ntasks, nnodes)
    directives = _directives(
        job.job_name,
        nodes,
        per_node,
        partition=job.partition,
        time=job.time,
        requeue=bool(max_restarts),
    )
    roles = f"chief:1,ps:{ps},worker:{ntasks - ps - 1}" if chief else ""
    srun = _srun_prefix(nodes, nnodes, per_node, chief=chief, max_restarts=max_restarts)
    lines = _preamble(directives, nodes, per_node, roles)
    if roles:
        lines += _run_until_chief_exits(srun, command, roles)
    else:
        lines += [shlex.join([*srun, *command]), "rc=$?"]
    if max_restarts:
        lines += _requeue_lines(max_restarts)
    lines += ['exit "$rc"', ""]
    return "\n".join(lines)


def _pinned(command: list[str]) -> list[str]:
    """``command`` run through `tfdist.launch.slurm_pin`, by the command's own Python if it
    names one, else by the Python writing the script (both must have tfdist)."""
    python = command[0] if os.path.basename(command[0]).startswith("python") else sys.executable
    return [python, "-m", "tfdist.launch.slurm_pin", "--", *command]


def _check_ps(ps: int, *, chief: bool) -> None:
    """Checks the number of parameter servers, which needs a chief."""
    check_non_negative_int("ps", ps)
    if ps and not chief:
        raise invalid_argument(
            "ps",
            ps,
            "0 without a chief",
            note="Parameter-server training needs a chief to coordinate it; add --chief.",
        )


def _node_range(min_nodes: int | None, nnodes: int, *, chief: bool, ntasks: int | None) -> str:
    """``#SBATCH --nodes``'s value: ``nnodes``, or ``min_nodes-nnodes`` for a range."""
    if min_nodes is None:
        return str(nnodes)
    check_positive_int("min_nodes", min_nodes)
    if min_nodes > nnodes:
        raise invalid_argument("min_nodes", min_nodes, f"at most nnodes={nnodes}")
    if chief or ntasks is not None:
        raise invalid_argument(
            "min_nodes",
            min_nodes,
            "None with --chief, --ps or --ntasks",
            note="A node range is for MultiWorkerMirrored jobs with --workers per node: the "
            "roles of a chief and ps are laid out for a fixed number of tasks.",
        )
    return f"{min_nodes}-{nnodes}" if min_nodes < nnodes else str(nnodes)


def _total_tasks(
    nnodes: int, workers: int | None, ntasks: int | None, *, ps: int, chief: bool
) -> int:
    """The job's total task count, from ``ntasks`` or ``workers`` per node plus the roles."""
    others = ps + int(bool(chief))
    if ntasks is None:
        check_positive_int("workers", 2 if workers is None else workers)
        ntasks = nnodes * (2 if workers is None else workers) + others
    elif workers is not None:
        raise invalid_argument(
            "workers",
            workers,
            "None with ntasks",
            note="Give the total --ntasks, or --workers per node, not both.",
        )
    check_positive_int("ntasks", ntasks)
    if ntasks < others + 1:
        raise invalid_argument(
            "ntasks",
            ntasks,
            f"at least {others + 1}",
            note=f"The roles need {int(bool(chief))} chief, {ps} ps and at least one worker.",
        )
    return ntasks


def _tasks_per_node(ntasks: int, nnodes: int) -> int:
    """``--ntasks-per-node``: the tasks split evenly over the nodes, within a job's port block."""
    if ntasks % nnodes:
        raise invalid_argument(
            "ntasks",
            ntasks,
            f"a multiple of nnodes={nnodes}",
            note="Every node runs the same number of tasks (--ntasks-per-node).",
        )
    per_node = ntasks // nnodes
    if per_node > SLURM_PORTS_PER_JOB:
        raise invalid_argument(
            "ntasks",
            ntasks,
            f"at most {SLURM_PORTS_PER_JOB} tasks per node",
            note="tfdist gives each job a block of that many ports per node.",
        )
    return per_node


def _directives(
    job_name: str,
    nodes: str,
    per_node: int,
    *,
    partition: str | None,
    time: str | None,
    requeue: bool,
) -> list[str]:
    """The ``#SBATCH`` options, checked: name, nodes, tasks, partition, time and requeue."""
    _check_word("job_name", job_name)
    directives = [f"--job-name={job_name}", f"--nodes={nodes}", f"--ntasks-per-node={per_node}"]
    if partition is not None:
        directives.append(f"--partition={_check_word('partition', partition)}")
    if time is not None:
        if not isinstance(time, str) or not _SLURM_TIME.fullmatch(time):
            raise invalid_argument(
                "time", time, "a Slurm time such as '30', '01:00:00' or '1-12:00:00'"
            )
        directives.append(f"--time={time}")
    if requeue:
        directives += [
            "--requeue",
            "--open-mode=append",
        ]  # Keep the first run's output when requeued.
    return directives


def _srun_prefix(
    nodes: str, nnodes: int, per_node: int, *, chief: bool, max_restarts: int
) -> list[str]:
    """The ``srun`` command and its options, before the task's command."""
    # A dying MWMS task must stop the others (they would wait in a collective), but a preempted
    # non-chief exits 75 while the chief may still commit the backup: then allow it 60 s.
    # With a chief (PS) the chief alone decides: ps and workers never exit on their own.
    bad_exit = (
        ["--kill-on-bad-exit=0"]
        if chief
        else ["--wait=60"]
        if max_restarts
        else ["--kill-on-bad-exit=1"]
    )
    # With a node range, srun runs on every node of the allocation, however many were granted.
    on_nodes = [] if "-" in nodes else [f"--nodes={nnodes}"]
    return ["srun", *on_nodes, f"--ntasks-per-node={per_node}", *bad_exit]


def _preamble(directives: list[str], nodes: str, per_node: int, roles: str) -> list[str]:
    """The script up to the ``srun`` step: shebang, directives, comments and environment."""
    return [
        "#!/bin/bash",
        *(f"#SBATCH {d}" for d in directives),
        "#",
        "# Written by `tfdist manifest slurm`; submit with `sbatch FILE`.",
        f"# {nodes} node(s) x {per_node} task(s). Each task builds the cluster from the "
        "SLURM_* variables",
        "# (tfdist.cluster.from_slurm, read by tfdist.make_strategy): "
        "one node talks over 127.0.0.1;",
        f"# the k-th task on a node listens on port {SLURM_PORT_BASE} + {SLURM_PORTS_PER_JOB} "
        f"* (job id % {SLURM_PORT_BLOCKS}) + k.",
        f"# Roles by rank: {roles}." if roles else "# Every task is a worker; rank 0 is the chief.",
        *(
            [f"# Slurm grants {nodes} nodes: each run trains on those, and a backup resumes there."]
            if "-" in nodes
            else []
        ),
        "set -uo pipefail",
        "unset TF_CONFIG  # One exported by the submitting shell would override the Slurm cluster.",
    ]


# Runs the task's command; rank 0 (the chief) also writes its exit code where the batch script
# waits for it.
_CHIEF_RC_WRAPPER = (
    '"$@"; rc=$?; if [ "$SLURM_PROCID" = 0 ]; then echo "$rc" > "$TFDIST_CHIEF_RC.tmp" '
    '&& mv "$TFDIST_CHIEF_RC.tmp" "$TFDIST_CHIEF_RC"; fi; exit "$rc"'
)


def _run_until_chief_exits(srun: list[str], command: list[str], roles: str) -> list[str]:
    """Lines that run the tasks with roles and end the step when the chief exits (``rc``)."""
    return [
        f"export TFDIST_SLURM_ROLES={roles}",
        "# The chief (rank 0, on this node) leaves its exit code here; then the ps and "
        "workers are stopped.",
        'export TFDIST_CHIEF_RC="${TMPDIR:-/tmp}/tfdist-$SLURM_JOB_ID-'
        '${SLURM_RESTART_COUNT:-0}.chief-rc"',
        'rm -f "$TFDIST_CHIEF_RC"',
        shlex.join([*srun, "bash", "-c", _CHIEF_RC_WRAPPER, "tfdist-task", *command]) + " &",
        "step=$!",
        'while kill -0 "$step" 2>/dev/null && [ ! -s "$TFDIST_CHIEF_RC" ]; do sleep 1; done',
        'if [ -s "$TFDIST_CHIEF_RC" ]; then',
        '  rc=$(cat "$TFDIST_CHIEF_RC"); rm -f "$TFDIST_CHIEF_RC"',
        '  kill -TERM "$step" 2>/dev/null; wait "$step"  '
        "# srun passes SIGTERM on to the ps and workers.",
        "else",
        '  wait "$step"; rc=$?',
        "fi",
    ]


def _requeue_lines(max_restarts: int) -> list[str]:
    """Lines that requeue the job when its tasks exit preempted or stuck, up to a limit."""
    return [
        f'if {{ [ "$rc" -eq {PREEMPTED_EXIT_CODE} ] || [ "$rc" -eq {STUCK_EXIT_CODE} ]; }} && '
        f'[ "${{SLURM_RESTART_COUNT:-0}}" -lt {max_restarts} ]; then',
        f'  echo "tfdist: tasks saved a backup after SIGTERM (exit {PREEMPTED_EXIT_CODE}) or '
        f"their watchdog found a hang (exit {STUCK_EXIT_CODE}); requeueing job $SLURM_JOB_ID "
        f'(restart $(( ${{SLURM_RESTART_COUNT:-0}} + 1 )) of {max_restarts})" >&2',
        '  scontrol requeue "$SLURM_JOB_ID"  '
        "# Ends this run; the job waits in the queue for its next one.",
        "fi",
    ]


def _check_word(name: str, value: Any) -> str:
    """Returns ``value`` if it is a non-empty string without whitespace, else raises."""
    if not isinstance(value, str) or not value or any(c.isspace() for c in value):
        raise invalid_argument(name, value, "a non-empty string without whitespace")
    return value
