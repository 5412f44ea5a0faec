"""``multi_worker``: ``MultiWorkerMirroredStrategy`` with the cluster from TF_CONFIG or Slurm.

Its runner, `MultiWorkerRunner`, is the sync runner with two capabilities more
(`tfdist.strategies.base`): balanced batches between the workers (a `BalancingRunner`) and the
hybrid's one replica per worker that a pipeline spans (a `HybridRunner`).
"""

from __future__ import annotations

import logging
from typing import Literal

import tensorflow as tf

from tfdist import cluster as cluster_lib
from tfdist.config import check_choice, check_positive_int, invalid_argument
from tfdist.strategies.balanced_split import BalancedSplit
from tfdist.strategies.mirrored import ensure_cpu_devices
from tfdist.strategies.sync import SyncRunner

logger = logging.getLogger(__name__)

_IMPLEMENTATIONS = {
    "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
    "ring": tf.distribute.experimental.CommunicationImplementation.RING,
    "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
}


def resolver_for(
    info: cluster_lib.ClusterInfo, num_gpus: int | None = None
) -> tf.distribute.cluster_resolver.ClusterResolver:
    """A cluster resolver for a validated `tfdist.cluster.ClusterInfo`.

    ``num_gpus``: the GPUs each worker's replicas use, which MultiWorkerMirroredStrategy reads
    from the resolver (a ``SimpleClusterResolver`` without them says none: CPU only).
    """
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(info.cluster),
        task_type=info.task_type,
        task_id=info.task_id,
        rpc_layer=info.rpc_layer or "grpc",
        num_accelerators=None if num_gpus is None else {"GPU": num_gpus},
    )


def _host_gpus() -> int:
    return len(tf.config.list_physical_devices("GPU"))


def _ready_stage_devices(stage_devices: int | None) -> int | None:
    """For the hybrid (pipeline stages): the GPUs one replica per worker uses (1), after
    splitting a GPU-less host's CPU into ``stage_devices`` logical devices (then None)."""
    if stage_devices is None:
        return None
    check_positive_int("stage_devices", stage_devices)
    if _host_gpus():
        return 1
    ensure_cpu_devices(stage_devices, argument="stage_devices")
    return None


def check_own_port(info: cluster_lib.ClusterInfo) -> None:
    """Raises a clear error if this task's loopback port is already taken."""
    host, _, port = info.address.rpartition(":")
    if cluster_lib.is_loopback(host):
        cluster_lib.check_port_free(
            host, int(port), what=f"TF_CONFIG.cluster.{info.task_type}[{info.task_id}]"
        )


class MultiWorkerRunner(SyncRunner):
    """`SyncRunner` on a ``MultiWorkerMirroredStrategy``: also a `BalancingRunner` and a
    `HybridRunner` (see `tfdist.strategies.base`)."""

    #: Balanced batches run here (``Trainer(balance=...)``).
    balance_refusal: str | None = None

    def enable_balance(self) -> BalancedSplit:
        """Trains on balanced shares of every global batch from now on."""
        if self.balanced is None:
            local = len(self.strategy.extended.worker_devices)
            workers = self.strategy.num_replicas_in_sync // local
            self.balanced = BalancedSplit(self.strategy, workers, local)
        return self.balanced

    @property
    def replica_devices(self) -> list[str]:
        """This worker's replica devices (one with ``build(stage_devices=K)``, the hybrid)."""
        return list(self.strategy.extended.worker_devices)


#: Runs training steps on this kind's strategies (see ``tfdist/strategies/registry.py``).
RUNNER = MultiWorkerRunner


def matches(strategy: tf.distribute.Strategy) -> bool:
    """Whether ``strategy`` (built by anyone) is a ``MultiWorkerMirroredStrategy``."""
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)


def build(
    communication: Literal["auto", "ring", "nccl"] = "auto", stage_devices: int | None = None
) -> tf.distribute.Strategy:
    """Builds a MultiWorkerMirroredStrategy for the cluster in TF_CONFIG (or Slurm).

    Every worker runs the same program; call this first in it. Without a
    cluster description it trains on this machine alone.

    Args:
        communication: Collective implementation: ``auto`` (NCCL on GPUs, ring
            otherwise), ``ring`` or ``nccl`` (GPUs only).
        stage_devices: For pipeline stages in each worker (``Trainer(pipeline=...)``, the
            hybrid): the devices each worker's stages need. One replica per worker: on a host
            with GPUs it uses GPU:0 (the stages take GPU:0..K-1); on a CPU-only host the CPU is
            split into ``stage_devices`` logical devices (before TensorFlow initialises), of
            which the replica uses CPU:0. Default None: every local GPU is a replica.

    Raises:
        ValueError: For a malformed TF_CONFIG, a cluster with ``ps`` tasks,
            ``nccl`` without GPUs, a port already in use, or a non-positive ``stage_devices``
            (or one TensorFlow's initialised CPU devices cannot give).
    """
    check_choice("communication", communication, _IMPLEMENTATIONS)
    if communication == "nccl" and not tf.config.list_physical_devices("GPU"):
        raise invalid_argument(
            "communication", communication, "'auto' or 'ring' on a machine without GPUs"
        )
    num_gpus = _ready_stage_devices(stage_devices)
    info = cluster_lib.from_environment()
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=_IMPLEMENTATIONS[communication]
    )
    if info is None:
        logger.info("No TF_CONFIG or Slurm cluster: multi_worker runs this process alone")
        resolver = None
        if num_gpus is not None:
            resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
                tf.train.ClusterSpec({}), num_accelerators={"GPU": num_gpus}
            )
        return tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=resolver, communication_options=options
        )
    if "ps" in info.cluster:
        raise invalid_argument(
            "strategy",
            "multi_worker",
            "'parameter_server' for a cluster with ps tasks",
            note=f"TF_CONFIG.cluster has task types {sorted(info.cluster)}.",
        )
    check_own_port(info)
    return tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=resolver_for(info, _host_gpus() if num_gpus is None else num_gpus),
        communication_options=options,
    )
