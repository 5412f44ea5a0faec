"""Slurm job steps -> a validated cluster spec and this task (pure Python, no TensorFlow).

:func:`tfdist.cluster.from_environment` calls :func:`detect` when TF_CONFIG is
not set. ``srun`` starts one process per task and sets SLURM_* variables;
:func:`from_slurm` turns them into the TF_CONFIG-equivalent
:class:`tfdist.cluster.ClusterInfo`::

    srun --ntasks=2 python -m tfdist train --strategy=multi_worker

Each job's tasks listen on a block of ports derived from the job id
(:func:`slurm_port_base`); a one-node step talks over 127.0.0.1. Roles come by
rank from TFDIST_SLURM_ROLES, which ``tfdist manifest slurm --chief --ps=N``
exports, else every task is a worker.
"""
from __future__ import annotations

import logging
import re
from typing import Mapping

from tfdist.cluster import _MISSING, ClusterInfo, join_address
from tfdist.config import invalid_argument

logger = logging.getLogger(__name__)

_SLURM_NODELISTS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST")
_SLURM_TASKS_PER_NODE = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
SLURM_PORT_BASE = 10000  # Slurm jobs' ports: blocks of SLURM_PORTS_PER_JOB from here (slurm_port_base).
SLURM_PORTS_PER_JOB = 32
# 10000 + 700 * 32 = 32400: below Linux's default ephemeral range (32768-60999), where outgoing
# connections take their local ports and could hold a task's port.
SLURM_PORT_BLOCKS = 700
SLURM_ROLES_VAR = "TFDIST_SLURM_ROLES"  # Roles by rank, e.g. "chief:1,ps:1,worker:2"; default all workers.
_SLURM_NEEDS = ("tfdist builds the cluster from the variables `srun` sets in each task (SLURM_JOB_ID, SLURM_PROCID, "
                "SLURM_STEP_NODELIST, SLURM_STEP_TASKS_PER_NODE); start the program with srun.")


def detect(environ: Mapping[str, str]) -> ClusterInfo | None:
    """The cluster of this Slurm job step, or None when this process is not one.

    A job step is a process ``srun`` started (SLURM_JOB_ID and SLURM_STEP_ID
    are set). Not clusters, so None: no Slurm job, an interactive
    ``srun --pty`` shell (SLURM_PTY_PORT is set), and a one-task allocation's
    batch script or ``salloc`` shell.

    Raises:
        ValueError: If the variables found are malformed, or this process runs
            in a Slurm allocation of several tasks but outside ``srun``.
    """
    if not environ.get("SLURM_JOB_ID"):
        return None
    if environ.get("SLURM_PTY_PORT"):
        # `srun --pty bash` is a step of one task for a person at a terminal; programs started in it
        # are not the tasks of a training cluster.
        logger.info("Interactive Slurm shell (srun --pty, job %s): not a cluster; ignoring SLURM_*.",
                    environ["SLURM_JOB_ID"])
        return None
    if not (environ.get("SLURM_STEP_ID") or environ.get("SLURM_STEPID")):
        ntasks = environ.get("SLURM_NTASKS", "1").strip()
        if ntasks.isdigit() and int(ntasks) > 1:
            raise invalid_argument(
                "SLURM_STEP_ID", _MISSING, "the variables of a job step that srun starts",
                note=f"This process runs in Slurm job {environ['SLURM_JOB_ID']} of {ntasks} tasks, but outside "
                     "`srun` (in the batch script or an salloc shell), so it is none of those tasks. Start it "
                     "with `srun COMMAND` (as `tfdist manifest slurm` writes), or ask for --ntasks=1.")
        return None
    return from_slurm(environ)


def slurm_port_base(job_id: int) -> int:
    """The port of the first task on each node of Slurm job ``job_id``.

    Jobs sharing a node get disjoint blocks of :data:`SLURM_PORTS_PER_JOB`
    ports in 10000..32399 (Lightning derives its port from the job id too), so
    they do not collide unless their ids differ by a multiple of 700. A
    requeued job keeps its id, so its next run reuses its ports.
    """
    return SLURM_PORT_BASE + (job_id % SLURM_PORT_BLOCKS) * SLURM_PORTS_PER_JOB


def slurm_roles(spec: str, *, name: str = SLURM_ROLES_VAR) -> list[tuple[str, int]]:
    """Parses a role list like ``"chief:1,ps:1,worker:2"`` (tasks by rank, in that order)."""
    roles = []
    for part in spec.split(","):
        match = re.fullmatch(r"\s*(chief|worker|ps):([0-9]+)\s*", part)
        if not match:
            raise invalid_argument(name, spec, "roles by rank like 'chief:1,ps:1,worker:2'",
                                   note="Task types: chief, worker, ps.")
        roles.append((match.group(1), int(match.group(2))))
    counts = dict(roles)
    if len(counts) != len(roles) or counts.get("chief", 0) > 1 or not (counts.get("worker") or counts.get("chief")):
        raise invalid_argument(name, spec, "each role once, at most one chief, and a chief or workers")
    if counts.get("ps") and not counts.get("chief"):
        raise invalid_argument(name, spec, "a chief with ps", note="The chief coordinates parameter-server training.")
    return [(t, n) for t, n in roles if n]


def from_slurm(environ: Mapping[str, str], *, port_base: int | None = None) -> ClusterInfo:
    """Builds the cluster of a Slurm job step from the variables ``srun`` sets.

    Tasks are assigned to the hosts of SLURM_STEP_NODELIST (or SLURM_JOB_NODELIST)
    in order, SLURM_STEP_TASKS_PER_NODE (or SLURM_TASKS_PER_NODE) at a time.
    The k-th task on a node listens on ``port_base + k``. A one-node step uses
    127.0.0.1 for every task: all of them are on this machine, and loopback
    keeps their traffic off the network whatever the node's name resolves to.

    Task SLURM_PROCID is worker SLURM_PROCID, unless TFDIST_SLURM_ROLES (which
    ``tfdist manifest slurm --chief --ps=N`` exports) gives roles by rank, e.g.
    ``chief:1,ps:1,worker:2``: rank 0 is the chief, rank 1 ps 0, ranks 2-3
    workers 0-1.

    Args:
        environ: The environment, e.g. ``os.environ``.
        port_base: The port of the first task on each node; by default
            :func:`slurm_port_base` of SLURM_JOB_ID, so jobs sharing a node
            do not collide.

    Returns:
        The :class:`ClusterInfo` of task SLURM_PROCID.

    Raises:
        ValueError: If a Slurm variable is missing or malformed, or they disagree.
    """
    nodelist_var = next((v for v in _SLURM_NODELISTS if environ.get(v)), None)
    if nodelist_var is None:
        raise invalid_argument(_SLURM_NODELISTS[0], _MISSING, "a Slurm host list like 'node[01-03]'",
                               note=_SLURM_NEEDS)
    if not environ.get("SLURM_PROCID"):
        raise invalid_argument("SLURM_PROCID", _MISSING, "this task's rank, an integer >= 0", note=_SLURM_NEEDS)
    hosts = expand_nodelist(environ[nodelist_var], name=nodelist_var)
    task_id = _slurm_int(environ, "SLURM_PROCID", minimum=0)
    tpn_var = next((v for v in _SLURM_TASKS_PER_NODE if environ.get(v)), None)
    ntasks_var = next((v for v in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS") if environ.get(v)), None)
    ntasks = _slurm_int(environ, ntasks_var, minimum=1) if ntasks_var else None
    if tpn_var is not None:
        per_node = expand_tasks_per_node(environ[tpn_var], name=tpn_var)
        if len(per_node) != len(hosts):
            raise invalid_argument(
                tpn_var, environ[tpn_var], f"counts for {len(hosts)} node(s)",
                note=f"{nodelist_var} lists {len(hosts)} node(s).")
    elif ntasks is not None and ntasks % len(hosts) == 0:
        per_node = [ntasks // len(hosts)] * len(hosts)
    else:
        raise invalid_argument(
            "SLURM_TASKS_PER_NODE", _MISSING, "a count such as '2(x3),1'",
            note="Set it, or SLURM_NTASKS as a multiple of the number of nodes.")
    total = sum(per_node)
    if ntasks is not None and ntasks != total:
        raise invalid_argument(ntasks_var, environ[ntasks_var], f"{total}",
                               note=f"{tpn_var} adds up to {total} tasks.")
    if task_id >= total:
        raise invalid_argument("SLURM_PROCID", environ["SLURM_PROCID"],
                               f"an integer in the range [0, {total - 1}]")
    if port_base is None:
        if not environ.get("SLURM_JOB_ID"):
            raise invalid_argument("SLURM_JOB_ID", _MISSING, "the job id, an integer", note=_SLURM_NEEDS)
        if max(per_node) > SLURM_PORTS_PER_JOB:
            raise invalid_argument(tpn_var or "SLURM_NTASKS", environ.get(tpn_var or "SLURM_NTASKS"),
                                   f"at most {SLURM_PORTS_PER_JOB} tasks per node",
                                   note="Each job gets a block of that many ports per node.")
        port_base = slurm_port_base(_slurm_int(environ, "SLURM_JOB_ID", minimum=0))
    if isinstance(port_base, bool) or not isinstance(port_base, int) or not (
            1 <= port_base and port_base + max(per_node) - 1 <= 65535):
        raise invalid_argument("port_base", port_base,
                               f"an integer in 1..{65536 - max(per_node)} ({max(per_node)} tasks per node)")
    if len(hosts) == 1:
        hosts = ["127.0.0.1"]
    addresses = [join_address(host, port_base + k) for host, n in zip(hosts, per_node) for k in range(n)]
    roles = slurm_roles(environ[SLURM_ROLES_VAR]) if environ.get(SLURM_ROLES_VAR) else [("worker", total)]
    if sum(n for _, n in roles) != total:
        raise invalid_argument(SLURM_ROLES_VAR, environ[SLURM_ROLES_VAR], f"roles for the step's {total} tasks",
                               note="Ask Slurm for as many tasks as the roles add up to.")
    cluster: dict[str, list[str]] = {}
    rank = 0
    for role, n in roles:
        cluster[role] = addresses[rank:rank + n]
        if rank <= task_id < rank + n:
            task_type, index = role, task_id - rank
        rank += n
    return ClusterInfo(cluster=cluster, task_type=task_type, task_id=index)


def _slurm_int(environ: Mapping[str, str], name: str, *, minimum: int) -> int:
    value = environ.get(name, _MISSING)
    if not isinstance(value, str) or not re.fullmatch(r"\s*[0-9]+\s*", value) or int(value) < minimum:
        raise invalid_argument(name, value, f"an integer >= {minimum}")
    return int(value)


def expand_nodelist(nodelist: str, *, name: str = "SLURM_JOB_NODELIST") -> list[str]:
    """Expands Slurm's compact host list, e.g. ``"node[01-03,07],gpu1"``.

    Zero padding is kept (``node[08-10]`` -> node08, node09, node10); several
    bracket groups in one name expand to their product, as Slurm does.

    Args:
        nodelist: The compact host list.
        name: The variable it came from, for the error message.

    Returns:
        The host names, in order.

    Raises:
        ValueError: On unbalanced brackets, empty names or bad ranges.
    """
    items, depth, start = [], 0, 0
    for i, char in enumerate(nodelist + ","):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise invalid_argument(name, nodelist, "a Slurm host list like 'node[01-03,07],other'",
                                   note="Its brackets are unbalanced.")
        if char == "," and depth == 0:
            items.append(nodelist[start:i].strip())
            start = i + 1
    if depth != 0 or not all(items):
        raise invalid_argument(name, nodelist, "a Slurm host list like 'node[01-03,07],other'")
    hosts: list[str] = []
    for item in items:
        expanded = [""]
        for literal, bracket in re.findall(r"([^\[\]]*)(\[[^\[\]]*\])?", item):
            if not literal and not bracket:
                continue
            suffixes = _expand_ranges(bracket[1:-1], name=name, nodelist=nodelist) if bracket else [""]
            expanded = [prefix + literal + s for prefix in expanded for s in suffixes]
        hosts.extend(expanded)
    return hosts


def _expand_ranges(ranges: str, *, name: str, nodelist: str) -> list[str]:
    out = []
    for part in ranges.split(","):
        match = re.fullmatch(r"\s*([0-9]+)(?:-([0-9]+))?\s*", part)
        if not match or (match.group(2) and int(match.group(2)) < int(match.group(1))):
            raise invalid_argument(name, nodelist, "a Slurm host list like 'node[01-03,07],other'",
                                   note=f"Bad range {part!r} in brackets.")
        first, last = match.group(1), match.group(2) or match.group(1)
        out.extend(str(n).zfill(len(first)) for n in range(int(first), int(last) + 1))
    return out


def expand_tasks_per_node(spec: str, *, name: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """Expands Slurm's tasks-per-node syntax, e.g. ``"2(x3),1"`` -> [2, 2, 2, 1].

    Raises:
        ValueError: If ``spec`` does not follow that syntax.
    """
    counts = []
    for part in spec.split(","):
        match = re.fullmatch(r"\s*([0-9]+)(?:\(x([0-9]+)\))?\s*", part)
        if not match or int(match.group(1)) < 1 or match.group(2) == "0":
            raise invalid_argument(name, spec, "task counts like '2(x3),1' (each count >= 1)")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts
