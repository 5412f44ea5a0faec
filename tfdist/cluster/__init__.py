"""Cluster environments -> a validated cluster spec and this task.

Pure Python (no TensorFlow import), so the launcher and the CLI stay fast::

    info = tfdist.cluster.from_environment()   # None outside a cluster
    if info is not None and info.is_chief:
        ...

Each environment is a `ClusterEnvironment` with a ``detect()``;
`from_environment` asks them in the order of `ENVIRONMENTS`:

* `TFConfigEnvironment` (`tfdist.cluster.tf_config`): TF_CONFIG, which
  ``tfdist launch`` and Kubernetes jobs (Kubeflow's TFJob, ``tfdist manifest kubernetes``) set;
* `SlurmEnvironment` (`tfdist.cluster.slurm`): a Slurm job step that ``srun`` started.

`tfdist.cluster.ports` holds addresses, port checks and `make_cluster`, the
one-machine (loopback) cluster of ``tfdist launch`` and the in-process parameter-server
strategy. Every problem raises one ``ValueError`` worded by
`tfdist.config.invalid_argument`, naming the offending field, e.g.
``TF_CONFIG.cluster.worker[1]``.

Modules: ``environment`` (the one interface), ``info`` (``ClusterInfo``, task labels, the
chief rule), ``tf_config``, ``slurm`` and ``slurm_syntax`` (Slurm's host lists and task
counts), ``ports``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from tfdist.cluster.environment import ClusterEnvironment
from tfdist.cluster.info import MISSING, VALID_TASK_TYPES, ClusterInfo, is_chief_task, task_label
from tfdist.cluster.ports import (
    check_port_free,
    is_loopback,
    join_address,
    make_cluster,
    split_address,
)
from tfdist.cluster.slurm import (
    SLURM_PORT_BASE,
    SLURM_PORT_BLOCKS,
    SLURM_PORTS_PER_JOB,
    SLURM_ROLES_VAR,
    SlurmEnvironment,
    from_slurm,
    slurm_port_base,
    slurm_roles,
)
from tfdist.cluster.slurm_syntax import expand_nodelist, expand_tasks_per_node
from tfdist.cluster.tf_config import TFConfigEnvironment, parse_tf_config

__all__ = [
    "ENVIRONMENTS",
    "MISSING",
    "SLURM_PORTS_PER_JOB",
    "SLURM_PORT_BASE",
    "SLURM_PORT_BLOCKS",
    "SLURM_ROLES_VAR",
    "VALID_TASK_TYPES",
    "ClusterEnvironment",
    "ClusterInfo",
    "SlurmEnvironment",
    "TFConfigEnvironment",
    "check_port_free",
    "expand_nodelist",
    "expand_tasks_per_node",
    "from_environment",
    "from_slurm",
    "is_chief_task",
    "is_loopback",
    "join_address",
    "make_cluster",
    "parse_tf_config",
    "slurm_port_base",
    "slurm_roles",
    "split_address",
    "task_label",
]

logger = logging.getLogger(__name__)

# In order: an explicit TF_CONFIG wins over the scheduler's variables (`tfdist launch` inside a
# Slurm allocation sets TF_CONFIG for its own tasks, and a user may override Slurm with it).
ENVIRONMENTS: tuple[ClusterEnvironment, ...] = (TFConfigEnvironment(), SlurmEnvironment())


def from_environment(environ: Mapping[str, str] | None = None) -> ClusterInfo | None:
    """Reads the cluster from the first of `ENVIRONMENTS` that detects one.

    That is TF_CONFIG, or else a Slurm job step: a process ``srun`` started
    (SLURM_JOB_ID and SLURM_STEP_ID are set). Not clusters, so None: an
    interactive ``srun --pty`` shell (SLURM_PTY_PORT is set), and a one-task
    allocation's batch script or ``salloc`` shell.

    Args:
        environ: The environment to read; defaults to ``os.environ``.

    Returns:
        The `ClusterInfo`, or None outside a cluster.

    Raises:
        ValueError: If the variables found are malformed, or this process runs
            in a Slurm allocation of several tasks but outside ``srun``.
    """
    environ = os.environ if environ is None else environ
    for environment in ENVIRONMENTS:
        if environment.detect(environ):
            logger.debug("Cluster environment: %s.", environment.name)
            return environment.cluster_info(environ)
    return None
