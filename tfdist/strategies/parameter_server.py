"""``parameter_server``: ``ParameterServerStrategy`` driven by a ``ClusterCoordinator``.

Two ways to get a cluster:

* ``make_strategy("parameter_server", num_workers=2, num_ps=1)`` with no
  TF_CONFIG starts worker and ps servers inside this process, on loopback
  ports (notebooks, tests, trying things out);
* with TF_CONFIG (e.g. ``tfdist launch --chief --workers=2 --ps=1 -- tfdist
  train --strategy=parameter_server``) every task runs the same program:
  ``make_strategy`` on a ``worker`` or ``ps`` task starts its gRPC server and
  serves until the job ends (it never returns); on the ``chief`` it returns
  the strategy, and that process coordinates training.

Variables live on the ps tasks; with ``min_shard_bytes`` large ones are split
into ``ShardedVariable`` shards across them (``MinSizePartitioner``).
"""
from __future__ import annotations

import logging
import sys
from typing import Any

import tensorflow as tf

from tfdist import cluster as cluster_lib
from tfdist.config import check_positive_int, invalid_argument
from tfdist.strategies.factory import register
from tfdist.strategies.multi_worker import check_own_port, resolver_for
from tfdist.strategies.ps_runner import PSRunner

logger = logging.getLogger(__name__)

# In-process servers share this process's thread pools; with the default two
# inter-op threads on a 2-core machine they deadlock.
INTER_OP_THREADS = 8


def server_config() -> tf.compat.v1.ConfigProto:
    """The ConfigProto every tfdist PS-cluster server gets."""
    config = tf.compat.v1.ConfigProto()
    config.inter_op_parallelism_threads = INTER_OP_THREADS
    return config


def serve_forever(info: cluster_lib.ClusterInfo) -> None:
    """Runs this worker or ps task's gRPC server until the process is stopped."""
    check_own_port(info)
    server = tf.distribute.Server(tf.train.ClusterSpec(info.cluster), job_name=info.task_type,
                                  task_index=info.task_id, protocol="grpc", config=server_config(), start=True)
    logger.info("%s:%d serving at %s for the parameter-server job", info.task_type, info.task_id, info.address)
    sys.stdout.flush()
    server.join()


def _partitioner(min_shard_bytes: int | None, num_ps: int) -> Any:
    if min_shard_bytes is None:
        return None
    check_positive_int("min_shard_bytes", min_shard_bytes)
    return tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=min_shard_bytes, max_shards=num_ps)


def _in_process_cluster(num_workers: int, num_ps: int) -> tuple[Any, list[tf.distribute.Server]]:
    spec = cluster_lib.make_cluster(workers=num_workers, ps=num_ps)
    cluster_spec = tf.train.ClusterSpec(spec)
    servers = []
    for job in ("worker", "ps"):
        for index in range(len(spec[job])):
            servers.append(tf.distribute.Server(cluster_spec, job_name=job, task_index=index, protocol="grpc",
                                                config=server_config(), start=True))
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(cluster_spec, rpc_layer="grpc")
    logger.info("Started an in-process cluster: %s", spec)
    return resolver, servers


@register("parameter_server", runner=PSRunner,
          matches=lambda s: isinstance(s, tf.distribute.experimental.ParameterServerStrategy))
def build(num_workers: int | None = None, num_ps: int | None = None,
          min_shard_bytes: int | None = None) -> tf.distribute.Strategy:
    """Builds a ParameterServerStrategy; this process becomes the coordinator.

    Args:
        num_workers: Workers of an in-process loopback cluster (default 2).
            Only without TF_CONFIG.
        num_ps: Parameter servers of the in-process cluster (default 1).
        min_shard_bytes: Partition variables larger than this across the ps
            tasks (``MinSizePartitioner``); default no partitioning.

    Raises:
        ValueError: For counts given together with TF_CONFIG, a cluster with
            no ps or no chief, bad counts, or a port already in use.
    """
    check_positive_int("num_workers", num_workers, allow_none=True)
    check_positive_int("num_ps", num_ps, allow_none=True)
    info = cluster_lib.from_environment()
    if info is None:
        resolver, servers = _in_process_cluster(num_workers or 2, num_ps or 1)
        strategy = tf.distribute.experimental.ParameterServerStrategy(
            resolver, variable_partitioner=_partitioner(min_shard_bytes, num_ps or 1))
        strategy._tfdist_servers = servers  # keep the in-process servers alive with the strategy
        return strategy
    for name, value in (("num_workers", num_workers), ("num_ps", num_ps)):
        if value is not None:
            raise invalid_argument(name, value, "None when TF_CONFIG describes the cluster",
                                   note="The counts only size an in-process cluster.")
    if "ps" not in info.cluster:
        raise invalid_argument("TF_CONFIG.cluster", sorted(info.cluster), "a cluster with ps tasks",
                               note="Use strategy='multi_worker' for a cluster without parameter servers.")
    if info.task_type in ("worker", "ps"):
        serve_forever(info)
        raise SystemExit(0)
    if info.task_type != "chief":
        raise invalid_argument("TF_CONFIG.task.type", info.task_type, "chief, worker or ps",
                               note="The chief coordinates parameter-server training.")
    check_own_port(info)
    return tf.distribute.experimental.ParameterServerStrategy(
        resolver_for(info), variable_partitioner=_partitioner(min_shard_bytes, len(info.cluster["ps"])))
