"""``multi_worker``: ``MultiWorkerMirroredStrategy`` with the cluster from TF_CONFIG or Slurm."""

from __future__ import annotations

import logging
from typing import Literal

import tensorflow as tf

from tfdist import cluster as cluster_lib
from tfdist.config import check_choice, invalid_argument
from tfdist.strategies.sync import SyncRunner

logger = logging.getLogger(__name__)

_IMPLEMENTATIONS = {
    "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
    "ring": tf.distribute.experimental.CommunicationImplementation.RING,
    "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
}


def resolver_for(info: cluster_lib.ClusterInfo) -> tf.distribute.cluster_resolver.ClusterResolver:
    """A cluster resolver for a validated `tfdist.cluster.ClusterInfo`."""
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(info.cluster),
        task_type=info.task_type,
        task_id=info.task_id,
        rpc_layer=info.rpc_layer or "grpc",
    )


def check_own_port(info: cluster_lib.ClusterInfo) -> None:
    """Raises a clear error if this task's loopback port is already taken."""
    host, _, port = info.address.rpartition(":")
    if cluster_lib.is_loopback(host):
        cluster_lib.check_port_free(
            host, int(port), what=f"TF_CONFIG.cluster.{info.task_type}[{info.task_id}]"
        )


#: Runs training steps on this kind's strategies (see ``tfdist/strategies/registry.py``).
RUNNER = SyncRunner


def matches(strategy: tf.distribute.Strategy) -> bool:
    """Whether ``strategy`` (built by anyone) is a ``MultiWorkerMirroredStrategy``."""
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)


def build(communication: Literal["auto", "ring", "nccl"] = "auto") -> tf.distribute.Strategy:
    """Builds a MultiWorkerMirroredStrategy for the cluster in TF_CONFIG (or Slurm).

    Every worker runs the same program; call this first in it. Without a
    cluster description it trains on this machine alone.

    Args:
        communication: Collective implementation: ``auto`` (NCCL on GPUs, ring
            otherwise), ``ring`` or ``nccl`` (GPUs only).

    Raises:
        ValueError: For a malformed TF_CONFIG, a cluster with ``ps`` tasks,
            ``nccl`` without GPUs, or a port already in use.
    """
    check_choice("communication", communication, _IMPLEMENTATIONS)
    if communication == "nccl" and not tf.config.list_physical_devices("GPU"):
        raise invalid_argument(
            "communication", communication, "'auto' or 'ring' on a machine without GPUs"
        )
    info = cluster_lib.from_environment()
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=_IMPLEMENTATIONS[communication]
    )
    if info is None:
        logger.info("No TF_CONFIG or Slurm cluster: multi_worker runs this process alone")
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    if "ps" in info.cluster:
        raise invalid_argument(
            "strategy",
            "multi_worker",
            "'parameter_server' for a cluster with ps tasks",
            note=f"TF_CONFIG.cluster has task types {sorted(info.cluster)}.",
        )
    check_own_port(info)
    return tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=resolver_for(info), communication_options=options
    )
