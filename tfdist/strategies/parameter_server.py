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

TF servers cannot be stopped, so an in-process cluster is started once per
shape (workers, ps) and reused by every later ``make_strategy`` of that shape
in the process: each call gets a new strategy (and coordinator) over the same
servers. TF's gRPC server binds ``0.0.0.0`` whatever host the cluster names
(``grpc_server_lib`` has no bind-address option), so its ports are reachable
from other hosts unless a firewall drops them; the first in-process cluster
logs a warning that names the ports.

Connecting the coordinator to a cluster renames this process's devices
``/job:chief/...``: datasets, variables and functions made before stop working.
So, as ``mirrored`` refuses to add devices late, ``parameter_server`` refuses
to connect after TensorFlow has started unless ``allow_late_connect=True``.
"""

from __future__ import annotations

import logging
import sys
import weakref
from typing import Any

import tensorflow as tf

from tfdist import _compat
from tfdist import cluster as cluster_lib
from tfdist._compat.tf_internals.runtime import (
    connected_cluster,
    connected_to_cluster,
    tf_runtime_started,
)
from tfdist.config import check_positive_int, invalid_argument
from tfdist.strategies.multi_worker import check_own_port, resolver_for
from tfdist.strategies.ps.runner import PSRunner

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
    server = tf.distribute.Server(
        tf.train.ClusterSpec(info.cluster),
        job_name=info.task_type,
        task_index=info.task_id,
        protocol="grpc",
        config=server_config(),
        start=True,
    )
    logger.info(
        "%s:%d serving at %s for the parameter-server job",
        info.task_type,
        info.task_id,
        info.address,
    )
    sys.stdout.flush()
    server.join()


def _partitioner(min_shard_bytes: int | None, num_ps: int) -> Any:
    if min_shard_bytes is None:
        return None
    check_positive_int("min_shard_bytes", min_shard_bytes)
    return tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=min_shard_bytes, max_shards=num_ps
    )


# (num_workers, num_ps) -> (resolver, servers): servers cannot be stopped, so
# they live as long as the process and every strategy of that shape reuses them.
_CLUSTERS: dict[tuple[int, int], tuple[Any, list[tf.distribute.Server]]] = {}
# strategy -> the in-process servers it runs on. Weak keys: a map beside the strategy (no
# attribute set on TF's object) that forgets a strategy once it is collected.
_SERVERS_OF: weakref.WeakKeyDictionary[tf.distribute.Strategy, list[tf.distribute.Server]] = (
    weakref.WeakKeyDictionary()
)
_warned_exposed = False


def _warn_exposed() -> None:
    """Says once per process that the in-process servers listen on every interface (which ports)."""
    global _warned_exposed
    if _warned_exposed:
        return
    _warned_exposed = True
    # The connected cluster: our servers plus the coordinator's own (its port is TF's pick).
    ports = sorted(
        int(a.rpartition(":")[2]) for tasks in connected_cluster().values() for a in tasks
    )
    listed = ",".join(map(str, ports))
    logger.warning(
        "The in-process parameter-server cluster listens on every network interface, on ports %s "
        "(TF's gRPC server binds 0.0.0.0 and has no option to bind loopback only), without "
        "authentication: anyone who can reach this machine can run TF graphs in this process. On a "
        "shared network, drop outside traffic to them, e.g. "
        "`iptables -I INPUT ! -i lo -p tcp -m multiport --dports %s -j DROP`.",
        listed,
        listed,
    )


def _in_process_cluster(num_workers: int, num_ps: int) -> tuple[Any, list[tf.distribute.Server]]:
    """This process's loopback cluster of that shape, started on first use."""
    key = (num_workers, num_ps)
    if key in _CLUSTERS:
        logger.info(
            "Reusing this process's in-process cluster of %d workers and %d ps", num_workers, num_ps
        )
        return _CLUSTERS[key]
    spec = cluster_lib.make_cluster(workers=num_workers, ps=num_ps)
    cluster_spec = tf.train.ClusterSpec(spec)
    servers = []
    for job in ("worker", "ps"):
        for index in range(len(spec[job])):
            servers.append(
                tf.distribute.Server(
                    cluster_spec,
                    job_name=job,
                    task_index=index,
                    protocol="grpc",
                    config=server_config(),
                    start=True,
                )
            )
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(cluster_spec, rpc_layer="grpc")
    logger.info("Started an in-process cluster: %s", spec)
    _CLUSTERS[key] = (resolver, servers)
    return resolver, servers


def in_process_servers(strategy: tf.distribute.Strategy) -> list[tf.distribute.Server] | None:
    """The in-process servers ``strategy`` runs on, or None if its cluster is not in-process.

    Strategies of the same shape share them (servers cannot be stopped, so they
    live as long as the process).
    """
    return _SERVERS_OF.get(strategy)


def _check_not_late(allow_late_connect: bool) -> None:
    """Refuses to connect to a cluster once TensorFlow has started (unless allowed)."""
    if allow_late_connect or connected_to_cluster() or not tf_runtime_started():
        return
    raise invalid_argument(
        "allow_late_connect",
        False,
        "True, or a call of make_strategy('parameter_server') before any other TensorFlow work",
        note="TensorFlow has already started in this process. Connecting to the cluster "
        "renames the local devices /job:chief/..., so datasets, variables and functions made "
        "before fail ('/job:localhost/... unknown device'). Call tfdist.make_strategy first in the "
        "program, or pass allow_late_connect=True if nothing made before is used afterwards.",
    )


#: Runs training steps on this kind's strategies (see ``tfdist/strategies/registry.py``).
RUNNER = PSRunner


def matches(strategy: tf.distribute.Strategy) -> bool:
    """Whether ``strategy`` (built by anyone) is a ``ParameterServerStrategy``."""
    return isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)


def build(
    num_workers: int | None = None,
    num_ps: int | None = None,
    min_shard_bytes: int | None = None,
    allow_late_connect: bool = False,
) -> tf.distribute.Strategy:
    """Builds a ParameterServerStrategy; this process becomes the coordinator.

    Args:
        num_workers: Workers of an in-process loopback cluster (default 2).
            Only without TF_CONFIG.
        num_ps: Parameter servers of the in-process cluster (default 1).
        min_shard_bytes: Partition variables larger than this across the ps
            tasks (``MinSizePartitioner``); default no partitioning. Works in
            the Trainer and in your own ``ClusterCoordinator`` loops (tfdist's
            ``ShardedVariable`` shims are applied here).
        allow_late_connect: Connect although TensorFlow already ran in this
            process. Whatever was made before (datasets, variables, functions)
            then fails with "/job:localhost/... unknown device".

    Raises:
        ValueError: For counts given together with TF_CONFIG, a cluster with
            no ps or no chief, bad counts, a port already in use, or a call
            after TensorFlow started without ``allow_late_connect``.
    """
    check_positive_int("num_workers", num_workers, allow_none=True)
    check_positive_int("num_ps", num_ps, allow_none=True)
    if not isinstance(allow_late_connect, bool):
        raise invalid_argument("allow_late_connect", allow_late_connect, "True or False")
    info = cluster_lib.from_environment()
    # User loops meet ShardedVariables and concurrent Keras updates too, not only the Trainer.
    _compat.apply()
    _compat.apply_sharded_variable_shims()
    if info is None:
        partitioner = _partitioner(min_shard_bytes, num_ps or 1)
        _check_not_late(allow_late_connect)
        resolver, servers = _in_process_cluster(num_workers or 2, num_ps or 1)
        strategy = tf.distribute.experimental.ParameterServerStrategy(
            resolver, variable_partitioner=partitioner
        )
        _SERVERS_OF[strategy] = servers
        _warn_exposed()
        return strategy
    for name, value in (("num_workers", num_workers), ("num_ps", num_ps)):
        if value is not None:
            raise invalid_argument(
                name,
                value,
                "None when TF_CONFIG describes the cluster",
                note="The counts only size an in-process cluster.",
            )
    if "ps" not in info.cluster:
        raise invalid_argument(
            "TF_CONFIG.cluster",
            sorted(info.cluster),
            "a cluster with ps tasks",
            note="Use strategy='multi_worker' for a cluster without parameter servers.",
        )
    if info.task_type in ("worker", "ps"):
        serve_forever(info)
        raise SystemExit(0)
    if info.task_type != "chief":
        raise invalid_argument(
            "TF_CONFIG.task.type",
            info.task_type,
            "chief, worker or ps",
            note="The chief coordinates parameter-server training.",
        )
    check_own_port(info)
    partitioner = _partitioner(min_shard_bytes, len(info.cluster["ps"]))
    _check_not_late(allow_late_connect)
    return tf.distribute.experimental.ParameterServerStrategy(
        resolver_for(info), variable_partitioner=partitioner
    )
