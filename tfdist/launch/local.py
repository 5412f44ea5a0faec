"""Start one local process per cluster task, with TF_CONFIG set, and supervise them.

This is what ``tfdist launch`` runs. On one machine (a loopback cluster)::

    tfdist launch --workers=2 --ps=1 -- python train.py

On several machines, run the same command on each, changing only ``--node_rank``::

    tfdist launch --nnodes=2 --node_rank=0 --hosts=h1:2222,h2:2222 --workers=2 \\
        --allow_external -- python train.py
    tfdist launch --nnodes=2 --node_rank=1 --hosts=h1:2222,h2:2222 --workers=2 \\
        --allow_external -- python train.py

Each launcher computes the whole cluster (see `node_cluster`) and starts
only its own node's tasks. Every process gets its own TF_CONFIG and its own
process group. Their output is merged line by line, each line prefixed
``[worker:0] ``. The job succeeds when every chief, worker and evaluator exits
0; parameter servers never exit on their own and are stopped once the workers
are done. Any failure stops the whole job (on this node). No TensorFlow is
imported here.

This module only ties the parts together; each lives in its own module:

* `tfdist.launch.tasks`: a task's name, environment (TF_CONFIG) and result, and
  `LaunchSpec`: `launch`'s arguments as one object, passed whole to the parts below;
* `tfdist.launch.layout`: the cluster on one machine, or over ``--hosts`` nodes;
* `tfdist.launch.pinning`: each chief and worker task's own CPUs and TF
  thread pools, where they fit (``--pin=false``: none);
* `tfdist.launch.isolation`: the namespaces the tasks run in, and warnings
  where none can be made;
* `tfdist.launch.supervisor`: spawning, watching, restarting and stopping them.

TF's gRPC servers listen on every interface whatever TF_CONFIG says, so a
single-machine launch runs its tasks in a private network namespace that has
only loopback (see `tfdist.launch.isolation`): other hosts cannot reach
them. No task outlives the launcher, even one killed with SIGKILL: they share a
PID namespace that dies with it. Where the kernel does not allow namespaces
(not root), the launcher says so and names the ports to firewall.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from typing import TextIO

from tfdist.cluster import is_loopback, split_address
from tfdist.config import check_non_negative_int, invalid_argument
from tfdist.launch.isolation import Sandbox, report_exposure
from tfdist.launch.layout import multi_node_cluster, node_cluster, parse_hosts, single_node_cluster
from tfdist.launch.pinning import Pinning, plan_pinning
from tfdist.launch.preload import Preloader, check_preload
from tfdist.launch.supervisor import TIMEOUT_RETURNCODE, Supervisor
from tfdist.launch.tasks import LaunchSpec, Task, TaskResult, all_tasks, check_command, task_env

# The launcher's public names, importable from here as before the split.
__all__ = [
    "launch",
    "run",
    "LaunchSpec",
    "node_cluster",
    "Supervisor",
    "Task",
    "TaskResult",
    "task_env",
    "TIMEOUT_RETURNCODE",
]


def launch(
    command: Sequence[str],
    *,
    workers: int,
    ps: int = 0,
    chief: bool = False,
    evaluator: bool = False,
    host: str = "127.0.0.1",
    allow_external: bool = False,
    ports: Sequence[int] | None = None,
    env: Mapping[str, str] | None = None,
    output: TextIO | None = None,
    timeout: float | None = None,
    max_restarts: int = 0,
    nnodes: int = 1,
    node_rank: int = 0,
    hosts: Sequence[str] | str | None = None,
    private_network: bool = True,
    pin: bool = True,
    preload: Sequence[str] | str | None = None,
) -> int:
    """Runs ``command`` once per task of this node and supervises the processes.

    With the defaults (one node, no ``hosts``) every task of a cluster on
    ``host`` runs here. With ``hosts``, the cluster spans ``nnodes`` nodes laid
    out by `node_cluster`, and only node ``node_rank``'s tasks run here;
    start one launcher per node with the same arguments but ``node_rank``.

    Args:
        command: The program and its arguments, e.g. ``[sys.executable, "train.py"]``.
        workers: The number of workers (per node with ``hosts``; >= 1).
        ps: The number of parameter servers (per node with ``hosts``).
        chief: Whether to add a chief task (on node 0 with ``hosts``).
        evaluator: Whether to add an evaluator task (on node 0 with ``hosts``).
        host: The address every task listens on, without ``hosts``. Must be
            loopback unless ``allow_external`` is set.
        allow_external: Allow non-loopback addresses in ``host`` or ``hosts``.
            TF's gRPC servers are unauthenticated and execute any graph sent to
            them; a warning is logged.
        ports: One port per task (chief, workers, ps, evaluator); free ports by
            default. Not allowed with ``hosts``, whose base ports fix them.
        env: The base environment of every task; defaults to ``os.environ``.
        output: Where the prefixed output lines go; defaults to ``sys.stdout``.
        timeout: Seconds after which every task is killed, or None.
        max_restarts: Restarts allowed after failures (see `Supervisor`).
            With parameter servers a failed worker is restarted alone, and once
            restarts run out the coordinator goes on with the other workers.
            With ``hosts`` each node restarts only its own tasks.
        nnodes: The number of nodes (machines).
        node_rank: This node's index into ``hosts``; node 0 runs the chief.
        hosts: One ``"host:base_port"`` per node, as a list or a comma-separated
            string; required when ``nnodes > 1``.
        private_network: Run a single-machine cluster on loopback in a private
            network namespace (Linux, root), so that no other host can reach
            its unauthenticated gRPC ports. The tasks then reach nothing
            outside it either (no internet); pass False if they must, and
            firewall the ports. Not used with ``hosts`` or a non-loopback ``host``.
        pin: Give each chief and worker task of this node its own share of the
            CPUs this launcher may use, and TF thread pools to match (intra-op:
            its CPUs; inter-op: as many, at least 2), whenever they fit (see
            `tfdist.launch.pinning`); logged one line per task. Parameter
            servers and evaluators see every CPU. Restarts keep the same CPUs.
        preload: Modules (e.g. ``("tensorflow", "keras")``) that one Python imports
            before any task starts; every task, restarts included, is then forked from it
            and starts with them imported (see `tfdist.launch.preload`). The command
            must be ``PYTHON SCRIPT|-m MODULE|-c CODE [ARGS]``. None or empty: each task
            starts afresh.

    Returns:
        0 when every chief, worker and evaluator (of this node) exited 0;
        otherwise the failing task's exit code (or 1), 130/143 when interrupted
        by SIGINT/SIGTERM, or 124 on timeout. A node without the chief in a
        parameter-server job ends only when its tasks exit or it is stopped.

    Raises:
        ValueError: On a bad argument, a port in use, or a command that cannot start.
    """
    return run(
        LaunchSpec(
            command=command,
            workers=workers,
            ps=ps,
            chief=chief,
            evaluator=evaluator,
            host=host,
            allow_external=allow_external,
            ports=ports,
            env=env,
            output=output,
            timeout=timeout,
            max_restarts=max_restarts,
            nnodes=nnodes,
            node_rank=node_rank,
            hosts=hosts,
            private_network=private_network,
            pin=pin,
            preload=preload,
        )
    )


def run(spec: LaunchSpec) -> int:
    """`launch` with its arguments as one `LaunchSpec`: checks them, runs this node's tasks.

    What ``notebook_launcher`` and `launch` call; returns and raises as `launch` does.
    """
    command = check_command(spec.command)
    preload = check_preload(spec.preload, command)
    check_non_negative_int("max_restarts", spec.max_restarts)
    _check_timeout(spec.timeout)
    output = sys.stdout if spec.output is None else spec.output
    spec = dataclasses.replace(spec, command=command, preload=preload, output=output)
    cluster, local_tasks, loopback = _cluster_here(spec)
    _check_program(command, spec.env)
    pinning = plan_pinning(
        [(t.task_type, t.task_id) for t in local_tasks], pin=spec.pin, env=spec.env
    )
    return _supervise(spec, cluster, local_tasks, pinning=pinning, loopback=loopback)


def _check_timeout(timeout: float | None) -> None:
    """Checks that ``timeout`` is a positive number of seconds or None."""
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0
    ):
        raise invalid_argument("timeout", timeout, "a positive number of seconds or None")


def _cluster_here(spec: LaunchSpec) -> tuple[dict[str, list[str]], list[Task], bool]:
    """The whole cluster, this node's tasks, and whether every address is loopback."""
    if spec.single_node:
        cluster = single_node_cluster(spec)
        return cluster, all_tasks(cluster), is_loopback(spec.host)
    cluster, local_tasks = multi_node_cluster(spec)
    nodes = parse_hosts(spec.hosts, spec.nnodes)[1]
    return cluster, local_tasks, all(is_loopback(h) for h, _ in nodes)


def _check_program(command: list[str], env: Mapping[str, str] | None) -> None:
    """Checks that ``command``'s program exists on the tasks' PATH."""
    path = (os.environ if env is None else env).get("PATH", os.defpath)
    # Checked here, once: inside the sandbox helper a missing program would only fail later,
    # in every task, as exit code 127.
    if shutil.which(command[0], path=path) is None:
        raise invalid_argument(
            "command",
            command,
            "a program that exists",
            note=f"Starting it failed: no executable {command[0]!r} (PATH={path}).",
        )


def _supervise(
    spec: LaunchSpec,
    cluster: dict[str, list[str]],
    local_tasks: list[Task],
    *,
    pinning: dict[str, Pinning],
    loopback: bool,
) -> int:
    """Runs this node's tasks in their sandbox under a `Supervisor`; their exit code."""
    # A private network only for a one-machine loopback cluster: tasks of a multi-node (or
    # non-loopback) cluster must reach other hosts.
    single_node = spec.single_node
    private_network = single_node and loopback and bool(spec.private_network)
    with Sandbox(private_network=private_network) as sandbox:
        ports_here = [split_address(cluster[t.task_type][t.task_id])[1] for t in local_tasks]
        report_exposure(
            sandbox,
            ports_here,
            single_node=single_node,
            loopback=loopback,
            private_network=spec.private_network,
        )
        preloader = None
        if spec.preload:
            preloader = Preloader(
                spec.command[0], spec.preload, sandbox=sandbox, env=spec.env, output=spec.output
            )
            preloader.start()
        try:
            supervisor = Supervisor(
                spec,
                cluster,
                tasks=local_tasks,
                sandbox=sandbox,
                pinning=pinning,
                zygote=preloader.socket if preloader else None,
            )
            return supervisor.run(spec.timeout)
        finally:
            if preloader is not None:
                preloader.close()
