"""Pipeline stages on the tasks of a cluster: one stage per process, the chief trains.

Run the same program on every task (``tfdist launch --workers=K -- python train.py``, Slurm, or
any TF_CONFIG launch), and in it::

    devices = tfdist.stage_tasks()  # the chief: one device per task; the others never return
    trainer = tfdist.Trainer(build, optimizer="adam", loss=loss,
        pipeline=tfdist.PipelineOptions(split_at=["block_2"], micro_batches=8, devices=devices))

On the chief, `stage_tasks` connects this process to the cluster (its own device stays its
default, ``make_master_device_default=False``) and returns each task's device: stage ``k`` on
task ``k``, the chief's first. Each stage's variables and optimizer state then live in its task's
process, and its forward and backward run there; activations and their gradients cross
between processes. Only the chief runs Python: it reads the data, runs the step, writes logs and
backups.

Every other task only serves: `stage_tasks` starts its gRPC server, waits for the chief's to be
up, then for it to be gone (the chief's process has ended), and ends its own process with code 0
(a TF server cannot be stopped, so the process exits at once). A launcher that waits for every
task therefore ends when the chief does.

TF's gRPC server is unauthenticated and listens on every interface, whatever address TF_CONFIG
gives: keep the ports on a trusted network (``tfdist launch`` on one host can isolate them,
see ``docs/launch.md``).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time

import tensorflow as tf

from tfdist import cluster as cluster_lib
from tfdist.config import check_choice, invalid_argument
from tfdist.strategies.multi_worker import check_own_port, resolver_for
from tfdist.strategies.parameter_server import server_config

logger = logging.getLogger(__name__)

#: How long a stage task waits for the chief's server to come up.
CHIEF_START_SECONDS = 600.0


def stage_tasks(device_type: str | None = None, *, poll_seconds: float = 1.0) -> list[str]:
    """On the chief: connects to the cluster and returns one device per task, for
    ``PipelineOptions(devices=...)``. On every other task: serves until the chief is gone, then
    ends the process (never returns).

    Args:
        device_type: ``"CPU"`` or ``"GPU"``: the device of each task the stages use (its first
            one). Default: GPU when this host has one, else CPU (the tasks' hosts are assumed
            alike).
        poll_seconds: How often a stage task checks that the chief is still there.

    Returns:
        On the chief: ``["/job:J/replica:0/task:I/device:TYPE:0", ...]``, the chief first, then
        the workers in order.

    Raises:
        ValueError: Without a cluster (TF_CONFIG or Slurm), with ``ps`` or ``evaluator`` tasks,
            for a bad ``device_type``, or when this task's port is taken.
    """
    if device_type is None:
        device_type = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"
    check_choice("device_type", device_type, ("CPU", "GPU"))
    info = _cluster()
    tasks = [("chief", 0)] if info.cluster.get("chief") else []
    tasks += [("worker", i) for i in range(len(info.cluster.get("worker", [])))]
    if not info.is_chief:
        _serve_until_the_chief_is_gone(info, tasks[0], poll_seconds)
    tf.config.experimental_connect_to_cluster(
        resolver_for(info),
        job_name=info.task_type,
        task_index=info.task_id,
        make_master_device_default=False,
    )
    devices = [f"/job:{job}/replica:0/task:{i}/device:{device_type}:0" for job, i in tasks]
    logger.info("Pipeline stages on %d tasks: %s", len(devices), ", ".join(devices))
    return devices


def _cluster() -> cluster_lib.ClusterInfo:
    info = cluster_lib.from_environment()
    if info is None:
        raise invalid_argument(
            "TF_CONFIG",
            None,
            "a cluster of one task per pipeline stage, e.g. under tfdist launch --workers=K",
            note="tfdist.stage_tasks() puts each stage on a task of the cluster; for stages on "
            "this process's devices, leave PipelineOptions(devices=None).",
        )
    extra = sorted(set(info.cluster) - {"chief", "worker"})
    if extra:
        raise invalid_argument(
            "TF_CONFIG",
            f"a cluster with {', '.join(extra)} tasks",
            "chief and worker tasks only, one per pipeline stage",
        )
    return info


def _serve_until_the_chief_is_gone(
    info: cluster_lib.ClusterInfo, chief: tuple[str, int], poll_seconds: float
) -> None:
    """Serves this task's devices to the chief's stages; exits the process once it is gone."""
    check_own_port(info)
    server = tf.distribute.Server(
        tf.train.ClusterSpec(info.cluster),
        job_name=info.task_type,
        task_index=info.task_id,
        protocol="grpc",
        config=server_config(),
        start=True,
    )
    address = info.cluster[chief[0]][chief[1]]
    logger.info(
        "%s:%d serving its devices to the pipeline's stages at %s; the chief is at %s",
        info.task_type,
        info.task_id,
        info.address,
        address,
    )
    deadline = time.monotonic() + CHIEF_START_SECONDS
    while not _listening(address):
        if time.monotonic() > deadline:
            logger.error("The chief at %s did not start in %.0f s.", address, CHIEF_START_SECONDS)
            _exit(1)
        time.sleep(poll_seconds)
    while _listening(address):
        time.sleep(poll_seconds)
    logger.info("The chief at %s is gone: this stage task ends.", address)
    del server  # a TF server cannot be stopped: the process ends instead
    _exit(0)


def _listening(address: str) -> bool:
    """Whether a TCP connection to ``host:port`` is accepted."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=2.0):
            return True
    except OSError:
        return False


def _exit(code: int) -> None:
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
