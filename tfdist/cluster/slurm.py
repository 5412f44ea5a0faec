"""Slurm job steps -> a validated cluster spec and this task (pure Python, no TensorFlow).

`tfdist.cluster.from_environment` asks `SlurmEnvironment` when TF_CONFIG is
not set. ``srun`` starts one process per task and sets SLURM_* variables;
`from_slurm` turns them into the TF_CONFIG-equivalent
`tfdist.cluster.ClusterInfo`::

    srun --ntasks=2 python -m tfdist train --strategy=multi_worker

Each job's tasks listen on a block of ports derived from the job id
(`slurm_port_base`); a one-node step talks over 127.0.0.1. Roles come by
rank from TFDIST_SLURM_ROLES, which ``tfdist manifest slurm --chief --ps=N``
exports, else every task is a worker.

Why not TF's ``tf.distribute.cluster_resolver.SlurmClusterResolver`` (read in TF 2.21; it
parses the SLURM_STEP_* variables itself, without ``scontrol``). It would be the right tool
if it fit, but:

* importing it imports TensorFlow, and ``tfdist launch``, ``tfdist manifest`` and the CLI's
  parsing must not (tests/test_cli.py::test_launch_never_imports_tensorflow);
* it orders hosts with ``sorted()``, so for ``gpu[8-10]`` rank 0 (on gpu8, where Slurm puts
  it) gets gpu10's address; `from_slurm` keeps Slurm's order, which is the ranks' order;
* it sorts task types too, so a role order other than alphabetical is lost; it hands out
  GPUs: by default it runs ``nvidia-smi`` (FileNotFoundError on a CPU node), zero GPUs per
  task fails, it needs GPUs per node >= tasks per node, and it sets CUDA_VISIBLE_DEVICES;
* it needs SLURM_STEP_* (no SLURM_JOB_* fallback), names hosts even on one node (we use
  127.0.0.1 there, to keep traffic on loopback), takes one fixed port base (ours comes from
  the job id so that jobs sharing a node do not collide), and its errors (RuntimeError, or a
  ValueError around an assert) are not tfdist's one message naming variable and value.

What we keep from it: the same assignment of ranks to hosts and ports (k-th task on a node
at ``port_base + k``, roles as consecutive rank ranges).

tests/test_cluster.py::test_from_slurm_matches_tf_slurm_cluster_resolver checks that where
both apply (sorted hosts, workers) the two give the same cluster.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping

from tfdist.cluster.environment import ClusterEnvironment
from tfdist.cluster.info import MISSING, ClusterInfo
from tfdist.cluster.ports import join_address
from tfdist.cluster.slurm_syntax import expand_nodelist, expand_tasks_per_node
from tfdist.config import invalid_argument

logger = logging.getLogger(__name__)

_SLURM_NODELISTS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST")
_SLURM_TASKS_PER_NODE = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
# Slurm jobs' ports: blocks of SLURM_PORTS_PER_JOB from here (slurm_port_base).
SLURM_PORT_BASE = 10000
SLURM_PORTS_PER_JOB = 32
# 10000 + 700 * 32 = 32400: below Linux's default ephemeral range (32768-60999), where outgoing
# connections take their local ports and could hold a task's port.
SLURM_PORT_BLOCKS = 700
# Roles by rank, e.g. "chief:1,ps:1,worker:2"; by default every task is a worker.
SLURM_ROLES_VAR = "TFDIST_SLURM_ROLES"
_SLURM_NEEDS = (
    "tfdist builds the cluster from the variables `srun` sets in each task "
    "(SLURM_JOB_ID, SLURM_PROCID, SLURM_STEP_NODELIST, SLURM_STEP_TASKS_PER_NODE); "
    "start the program with srun."
)


class SlurmEnvironment(ClusterEnvironment):
    """A Slurm job step: a process ``srun`` started (SLURM_JOB_ID and SLURM_STEP_ID are set).

    Not clusters, so `detect` is False: no Slurm job, an interactive ``srun --pty``
    shell (SLURM_PTY_PORT is set), and a one-task allocation's batch script or ``salloc``
    shell. A batch script or ``salloc`` shell of several tasks is none of those tasks:
    `detect` raises, so that the job does not silently train on one process.
    """

    name = "Slurm"

    def detect(self, environ: Mapping[str, str]) -> bool:
        """True inside an ``srun`` job step; raises in an allocation of several tasks outside one.

        Raises:
            ValueError: If this process runs in a Slurm allocation of several tasks but
                outside ``srun``.
        """
        if not environ.get("SLURM_JOB_ID"):
            return False
        if environ.get("SLURM_PTY_PORT"):
            # `srun --pty bash` is a step of one task for a person at a terminal; programs
            # started in it are not the tasks of a training cluster.
            logger.info(
                "Interactive Slurm shell (srun --pty, job %s): not a cluster; ignoring SLURM_*.",
                environ["SLURM_JOB_ID"],
            )
            return False
        if environ.get("SLURM_STEP_ID") or environ.get("SLURM_STEPID"):
            return True
        ntasks = environ.get("SLURM_NTASKS", "1").strip()
        if ntasks.isdigit() and int(ntasks) > 1:
            raise invalid_argument(
                "SLURM_STEP_ID",
                MISSING,
                "the variables of a job step that srun starts",
                note=f"This process runs in Slurm job {environ['SLURM_JOB_ID']} of {ntasks} "
                "tasks, but outside `srun` (in the batch script or an salloc shell), so it "
                "is none of those tasks. Start it with `srun COMMAND` (as `tfdist manifest "
                "slurm` writes), or ask for --ntasks=1.",
            )
        return False

    def cluster_info(self, environ: Mapping[str, str]) -> ClusterInfo:
        """The cluster of this job step (see `from_slurm`)."""
        return from_slurm(environ)


def slurm_port_base(job_id: int) -> int:
    """The port of the first task on each node of Slurm job ``job_id``.

    Jobs sharing a node get disjoint blocks of `SLURM_PORTS_PER_JOB`
    ports in 10000..32399 (Lightning derives its port from the job id too), so
    they do not collide unless their ids differ by a multiple of 700. A
    requeued job keeps its id, so its next run reuses its ports.
    """
    # Why the job id: every task of a job computes the same ports with no rendezvous (each
    # only sees its own environment), and Slurm gives no port reservation of its own.
    return SLURM_PORT_BASE + (job_id % SLURM_PORT_BLOCKS) * SLURM_PORTS_PER_JOB


def slurm_roles(spec: str, *, name: str = SLURM_ROLES_VAR) -> list[tuple[str, int]]:
    """Parses a role list like ``"chief:1,ps:1,worker:2"`` (tasks by rank, in that order)."""
    roles = []
    for part in spec.split(","):
        match = re.fullmatch(r"\s*(chief|worker|ps):([0-9]+)\s*", part)
        if not match:
            raise invalid_argument(
                name,
                spec,
                "roles by rank like 'chief:1,ps:1,worker:2'",
                note="Task types: chief, worker, ps.",
            )
        roles.append((match.group(1), int(match.group(2))))
    counts = dict(roles)
    if (
        len(counts) != len(roles)
        or counts.get("chief", 0) > 1
        or not (counts.get("worker") or counts.get("chief"))
    ):
        raise invalid_argument(
            name, spec, "each role once, at most one chief, and a chief or workers"
        )
    if counts.get("ps") and not counts.get("chief"):
        raise invalid_argument(
            name, spec, "a chief with ps", note="The chief coordinates parameter-server training."
        )
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
            `slurm_port_base` of SLURM_JOB_ID, so jobs sharing a node
            do not collide.

    Returns:
        The `ClusterInfo` of task SLURM_PROCID.

    Raises:
        ValueError: If a Slurm variable is missing or malformed, or they disagree.
    """
    hosts, per_node, tpn_var, task_id = _step(environ)
    total = sum(per_node)
    port_base = _checked_port_base(environ, port_base, per_node, tpn_var)
    if len(hosts) == 1:
        # Every task is on this machine: loopback keeps the unauthenticated gRPC traffic off the
        # network, whatever the node's name resolves to (often a public address).
        hosts = ["127.0.0.1"]
    addresses = [
        join_address(host, port_base + k) for host, n in zip(hosts, per_node) for k in range(n)
    ]
    return _assign_roles(_step_roles(environ, total), addresses, task_id)


def node_tasks(environ: Mapping[str, str]) -> tuple[list[tuple[str, int]], tuple[str, int]]:
    """The tasks of this task's node, in rank order, and this task, as ``(task_type, task_id)``.

    Reads the same variables as `from_slurm` (block distribution: a node's
    tasks have consecutive ranks), so that each task of a node can choose its own
    CPUs without asking the others (`tfdist.launch.slurm_pin`).

    Raises:
        ValueError: If a Slurm variable is missing or malformed, or they disagree.
    """
    _, per_node, _, task_id = _step(environ)
    by_rank = [(role, i) for role, n in _step_roles(environ, sum(per_node)) for i in range(n)]
    first = 0
    while first + per_node[0] <= task_id:  # Skip the nodes before this task's.
        first += per_node.pop(0)
    return by_rank[first : first + per_node[0]], by_rank[task_id]


def _step(environ: Mapping[str, str]) -> tuple[list[str], list[int], str | None, int]:
    """The step's hosts, tasks per host, the variable those came from, and this task's rank."""
    nodelist_var, hosts, task_id = _hosts_and_rank(environ)
    per_node, tpn_var = _tasks_per_node(environ, hosts, nodelist_var)
    total = sum(per_node)
    if task_id >= total:
        raise invalid_argument(
            "SLURM_PROCID", environ["SLURM_PROCID"], f"an integer in the range [0, {total - 1}]"
        )
    return hosts, per_node, tpn_var, task_id


def _hosts_and_rank(environ: Mapping[str, str]) -> tuple[str, list[str], int]:
    """The host-list variable, the step's hosts in Slurm's order, and this task's rank."""
    nodelist_var = next((v for v in _SLURM_NODELISTS if environ.get(v)), None)
    if nodelist_var is None:
        raise invalid_argument(
            _SLURM_NODELISTS[0], MISSING, "a Slurm host list like 'node[01-03]'", note=_SLURM_NEEDS
        )
    if not environ.get("SLURM_PROCID"):
        raise invalid_argument(
            "SLURM_PROCID", MISSING, "this task's rank, an integer >= 0", note=_SLURM_NEEDS
        )
    hosts = expand_nodelist(environ[nodelist_var], name=nodelist_var)
    return nodelist_var, hosts, _slurm_int(environ, "SLURM_PROCID", minimum=0)


def _tasks_per_node(
    environ: Mapping[str, str], hosts: list[str], nodelist_var: str
) -> tuple[list[int], str | None]:
    """The task count on each host, checked against the total, and the variable it came from."""
    tpn_var = next((v for v in _SLURM_TASKS_PER_NODE if environ.get(v)), None)
    ntasks_var = next((v for v in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS") if environ.get(v)), None)
    ntasks = _slurm_int(environ, ntasks_var, minimum=1) if ntasks_var else None
    if tpn_var is not None:
        per_node = expand_tasks_per_node(environ[tpn_var], name=tpn_var)
        if len(per_node) != len(hosts):
            raise invalid_argument(
                tpn_var,
                environ[tpn_var],
                f"counts for {len(hosts)} node(s)",
                note=f"{nodelist_var} lists {len(hosts)} node(s).",
            )
    elif ntasks is not None and ntasks % len(hosts) == 0:
        per_node = [ntasks // len(hosts)] * len(hosts)
    else:
        raise invalid_argument(
            "SLURM_TASKS_PER_NODE",
            MISSING,
            "a count such as '2(x3),1'",
            note="Set it, or SLURM_NTASKS as a multiple of the number of nodes.",
        )
    total = sum(per_node)
    if ntasks is not None and ntasks != total:
        raise invalid_argument(
            ntasks_var, environ[ntasks_var], f"{total}", note=f"{tpn_var} adds up to {total} tasks."
        )
    return per_node, tpn_var


def _checked_port_base(
    environ: Mapping[str, str], port_base: int | None, per_node: list[int], tpn_var: str | None
) -> int:
    """``port_base``, or the job's block of ports by default, checked to fit every node's tasks."""
    if port_base is None:
        if not environ.get("SLURM_JOB_ID"):
            raise invalid_argument(
                "SLURM_JOB_ID", MISSING, "the job id, an integer", note=_SLURM_NEEDS
            )
        if max(per_node) > SLURM_PORTS_PER_JOB:
            count_var = tpn_var or "SLURM_NTASKS"
            raise invalid_argument(
                count_var,
                environ.get(count_var),
                f"at most {SLURM_PORTS_PER_JOB} tasks per node",
                note="Each job gets a block of that many ports per node.",
            )
        port_base = slurm_port_base(_slurm_int(environ, "SLURM_JOB_ID", minimum=0))
    if (
        isinstance(port_base, bool)
        or not isinstance(port_base, int)
        or not (1 <= port_base and port_base + max(per_node) - 1 <= 65535)
    ):
        raise invalid_argument(
            "port_base",
            port_base,
            f"an integer in 1..{65536 - max(per_node)} ({max(per_node)} tasks per node)",
        )
    return port_base


def _step_roles(environ: Mapping[str, str], total: int) -> list[tuple[str, int]]:
    """The roles by rank from TFDIST_SLURM_ROLES (default: all workers), one per task."""
    roles = (
        slurm_roles(environ[SLURM_ROLES_VAR])
        if environ.get(SLURM_ROLES_VAR)
        else [("worker", total)]
    )
    if sum(n for _, n in roles) != total:
        raise invalid_argument(
            SLURM_ROLES_VAR,
            environ[SLURM_ROLES_VAR],
            f"roles for the step's {total} tasks",
            note="Ask Slurm for as many tasks as the roles add up to.",
        )
    return roles


def _assign_roles(roles: list[tuple[str, int]], addresses: list[str], task_id: int) -> ClusterInfo:
    """The cluster with consecutive ranks per role, seen from task ``task_id``."""
    cluster: dict[str, list[str]] = {}
    rank = 0
    for role, n in roles:
        cluster[role] = addresses[rank : rank + n]
        if rank <= task_id < rank + n:
            task_type, index = role, task_id - rank
        rank += n
    return ClusterInfo(cluster=cluster, task_type=task_type, task_id=index)


def _slurm_int(environ: Mapping[str, str], name: str, *, minimum: int) -> int:
    """An integer SLURM_* variable (a string of digits), checked against ``minimum``."""
    value = environ.get(name, MISSING)
    if (
        not isinstance(value, str)
        or not re.fullmatch(r"\s*[0-9]+\s*", value)
        or int(value) < minimum
    ):
        raise invalid_argument(name, value, f"an integer >= {minimum}")
    return int(value)
