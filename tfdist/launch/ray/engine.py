"""Ray Train as the engine for many machines: ``ray_launcher`` and ``tfdist train --engine=ray``.

    def train():
        import tfdist
        strategy = tfdist.make_strategy("multi_worker")   # TF_CONFIG comes from Ray
        ...
        return history.history

    history = tfdist.launch.ray_launcher(train, num_workers=2, max_failures=1)
    # Elastic (Ray Train V2): 1 to 4 workers, as many as the cluster fits; Ray resizes the
    # group (a restart) as nodes come and go, and a RayBackup resumes on the new world size.
    history = tfdist.launch.ray_launcher(train, num_workers=(1, 4), max_failures=1)

Ray's ``ray.train.tensorflow.TensorflowTrainer`` starts one actor per worker,
sets ``TF_CONFIG`` and restarts the whole group after a failure
(``FailureConfig(max_failures=R)``). This module only starts that trainer
around a function that uses tfdist's public API; fault tolerance with
step-exact resumes is `tfdist.launch.ray.backup.RayBackup`, a Keras
callback that reports tfdist's backups as Ray checkpoints.

Before ``fn`` runs, each worker:

* sets TensorFlow's intra-op threads to the CPUs Ray gave it (and inter-op
  threads to that, at least 2, as collectives need one thread to wait on);
* points ``TF_CONFIG`` at 127.0.0.1 when every worker runs on this node (Ray
  writes the node's network address), so a one-machine group talks over
  loopback only.

Importing this module imports neither Ray nor TensorFlow.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from tfdist.config import check_non_negative_int, check_positive_int, invalid_argument

logger = logging.getLogger(__name__)

INSTALL_HINT = (
    "Ray is not installed. Install it with: pip install 'tfdist[ray]' "
    "(or pip install 'ray[train]')."
)


def require_ray() -> Any:
    """Imports Ray, or raises one ImportError that says how to install it."""
    try:
        import ray
        import ray.train  # noqa: F401
    except ImportError as e:  # ModuleNotFoundError included
        raise ImportError(f"{INSTALL_HINT} ({e})") from None
    return ray


def init_local(num_cpus: int | None = None) -> None:
    """Starts a loopback Ray cluster unless Ray is initialised or ``RAY_ADDRESS`` names one.

    Ray's own ports are then announced on 127.0.0.1 and the dashboard is off. Where stdout
    is not a terminal, the workers' lines Ray copies to it come without colour codes.
    """
    ray = require_ray()
    if ray.is_initialized():
        return
    if not sys.stdout.isatty():  # a log file, or a pipe: the workers' lines without colour codes
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    if os.environ.get("RAY_ADDRESS"):
        ray.init()
        return
    # Ray's (underscored) keyword for the address its processes announce: without it a
    # one-machine cluster would announce, and be reached at, the host's network address.
    ray.init(num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1")


def worker_range(num_workers: int | tuple[int, int]) -> tuple[int, int]:
    """``num_workers`` as ``(fewest, most)``: an int is both ends.

    Raises:
        ValueError: Unless an int >= 1 or a pair ``(min, max)`` of them with ``min <= max``.
    """
    if isinstance(num_workers, tuple) and len(num_workers) == 2:
        fewest, most = (check_positive_int("num_workers", n) for n in num_workers)
        if fewest <= most:
            return fewest, most
    elif not isinstance(num_workers, (tuple, list)):
        return check_positive_int("num_workers", num_workers), num_workers
    raise invalid_argument(
        "num_workers", num_workers, "a positive int, or a pair (min_workers, max_workers)"
    )


def scaling_config(
    num_workers: int | tuple[int, int], *, use_gpu: bool, cpus_per_worker: float
) -> Any:
    """Ray Train's ``ScalingConfig``; a ``(min, max)`` pair makes the group elastic.

    Raises:
        ValueError: For a pair, when this Ray's ``ScalingConfig`` has no elastic range.
    """
    from ray.train import ScalingConfig

    fewest, most = worker_range(num_workers)
    elastic = isinstance(num_workers, tuple)
    if elastic and not hasattr(ScalingConfig, "elasticity_enabled"):
        raise invalid_argument(
            "num_workers",
            num_workers,
            "an int with this Ray",
            note="A (min, max) range is Ray Train V2's elastic training (ray 2.60 has it); "
            "upgrade Ray, or give a number of workers.",
        )
    return ScalingConfig(
        num_workers=(fewest, most) if elastic else most,
        use_gpu=use_gpu,
        resources_per_worker={"CPU": cpus_per_worker},
    )


def _check_fits(ray: Any, num_workers: int, cpus_per_worker: float, use_gpu: bool) -> None:
    """Fails now, instead of Ray waiting forever, when the group cannot fit the cluster."""
    total = ray.cluster_resources()
    have = total.get("CPU", 0.0)
    if num_workers * cpus_per_worker > have:
        fit = int(have // cpus_per_worker) if cpus_per_worker else 0
        raise invalid_argument(
            "num_workers",
            num_workers,
            f"at most {fit} (the Ray cluster has {have:g} CPUs, {cpus_per_worker:g} per worker)",
            note="Ray would wait for the missing resources forever. Use fewer workers or CPUs "
            "per worker, add nodes, or pass check_resources=False on a cluster that autoscales.",
        )
    if use_gpu and num_workers > total.get("GPU", 0.0):
        raise invalid_argument(
            "num_workers",
            num_workers,
            f"at most {total.get('GPU', 0.0):g} with use_gpu=True (one GPU per worker)",
            note="Ray would wait for the missing GPUs forever.",
        )


def _local_tf_config() -> None:
    """Rewrites TF_CONFIG to 127.0.0.1 when every worker of the group is on this node."""
    import ray

    config = json.loads(os.environ.get("TF_CONFIG", "{}"))
    workers = config.get("cluster", {}).get("worker", [])
    hosts = {w.rsplit(":", 1)[0] for w in workers}
    if hosts and hosts <= {ray.util.get_node_ip_address(), "127.0.0.1", "localhost"}:
        config["cluster"]["worker"] = ["127.0.0.1:" + w.rsplit(":", 1)[1] for w in workers]
        os.environ["TF_CONFIG"] = json.dumps(config)


def set_threads_from_ray() -> int:
    """Sets TF's thread pools from the CPUs Ray assigned this worker; returns that count.

    Runs in a Ray Train worker before TensorFlow starts its runtime.
    """
    import ray
    import tensorflow as tf

    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 0.0)
    threads = max(int(cpus), 1)
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(max(threads, 2))
    return threads


def _make_results_box(ray: Any) -> Any:
    @ray.remote(num_cpus=0)
    class ResultsBox:
        """Holds each rank's return value of the last attempt (so a restart overwrites it)."""

        def __init__(self) -> None:
            self.results: dict[int, Any] = {}

        def put(self, rank: int, value: Any) -> None:
            self.results[rank] = value

        def get(self) -> dict[int, Any]:
            return self.results

    return ResultsBox.remote()


@dataclasses.dataclass
class RayRun:
    """What `ray_fit` returns.

    Attributes:
        result: Ray's ``ray.train.Result`` (final metrics, latest checkpoint, error).
        outputs: What ``fn`` returned on each rank, rank 0 (the chief) first.
    """

    result: Any
    outputs: list[Any]


def ray_fit(
    fn: Callable[..., Any],
    *args: Any,
    num_workers: int | tuple[int, int] = 2,
    cpus_per_worker: float = 1,
    use_gpu: bool = False,
    max_failures: int = 0,
    storage_path: str | None = None,
    name: str | None = None,
    datasets: dict[str, Any] | None = None,
    check_resources: bool = True,
) -> RayRun:
    """Runs ``fn(*args)`` on every worker of a Ray Train ``TensorflowTrainer``.

    Args:
        fn: The training function; it should create its strategy first
            (``tfdist.make_strategy("multi_worker")``). Ray pickles it with cloudpickle.
        *args: Arguments for ``fn``.
        num_workers: Ray Train workers (TF ``worker`` tasks; rank 0 is the chief), or a
            pair ``(min, max)`` for Ray Train's elastic training: Ray starts as many as the
            cluster fits, at least ``min``, and resizes the group (a restart) as resources
            come and go. A `RayBackup` resumes each new group
            at the same update on its world size; keep a global batch that every count divides.
        cpus_per_worker: CPUs Ray reserves per worker; TF's thread pools follow it.
        use_gpu: One GPU per worker.
        max_failures: Whole-group restarts after a worker fails
            (``FailureConfig(max_failures=...)``).
        storage_path: Where Ray keeps checkpoints and results (shared storage
            for several machines); Ray's default (``~/ray_results``) otherwise.
        name: The run's name under ``storage_path``.
        datasets: Ray Datasets; a worker reads its shard with
            ``ray.train.get_dataset_shard(name)``.
        check_resources: Fail at once when the cluster has fewer CPUs (or
            GPUs) than the group needs; turn off on an autoscaling cluster.

    Returns:
        A `RayRun`: Ray's ``Result`` and every rank's return value.

    Raises:
        ImportError: If Ray is not installed (the message says how to install it).
        ValueError: For a bad argument, or a group larger than the cluster.
        RuntimeError: If training failed after ``max_failures`` restarts.
    """
    options = RayFitOptions(
        num_workers=num_workers,
        cpus_per_worker=cpus_per_worker,
        use_gpu=use_gpu,
        max_failures=max_failures,
        storage_path=storage_path,
        name=name,
        datasets=datasets,
        check_resources=check_resources,
    )
    return run_ray_fit(fn, args, options)


@dataclasses.dataclass(frozen=True)
class RayFitOptions:
    """`ray_fit`'s keyword arguments as one object (see it for each)."""

    num_workers: int | tuple[int, int] = 2
    cpus_per_worker: float = 1
    use_gpu: bool = False
    max_failures: int = 0
    storage_path: str | None = None
    name: str | None = None
    datasets: dict[str, Any] | None = None
    check_resources: bool = True


def run_ray_fit(fn: Callable[..., Any], args: tuple[Any, ...], options: RayFitOptions) -> RayRun:
    """`ray_fit` with its keyword arguments as one `RayFitOptions`; returns and raises as it."""
    ray = require_ray()
    fewest, most = worker_range(options.num_workers)
    max_failures, cpus_per_worker = options.max_failures, options.cpus_per_worker
    check_non_negative_int("max_failures", max_failures)
    if not cpus_per_worker > 0:
        raise invalid_argument("cpus_per_worker", cpus_per_worker, "a positive number")
    from ray.train import FailureConfig, RunConfig
    from ray.train.tensorflow import TensorflowTrainer

    scaling = scaling_config(
        options.num_workers, use_gpu=options.use_gpu, cpus_per_worker=cpus_per_worker
    )
    init_local()
    if options.check_resources:  # the fewest must fit: Ray starts an elastic group with what fits
        _check_fits(ray, fewest, cpus_per_worker, options.use_gpu)
    box = _make_results_box(ray)
    trainer = TensorflowTrainer(
        _per_worker_loop(fn, args, box),
        scaling_config=scaling,
        run_config=RunConfig(
            name=options.name,
            storage_path=options.storage_path,
            failure_config=FailureConfig(max_failures=max_failures),
        ),
        datasets=options.datasets,
    )
    try:
        result = trainer.fit()
    except Exception as e:  # Ray's TrainingFailedError names the worker and carries its traceback.
        raise RuntimeError(f"The Ray Train job failed after {max_failures} restart(s): {e}") from e
    return RayRun(result=result, outputs=_collect_outputs(ray, box, fewest, most))


def _per_worker_loop(fn: Callable[..., Any], args: tuple[Any, ...], box: Any) -> Callable[[], None]:
    """Ray Train's ``train_loop_per_worker``: ``fn(*args)`` with TF set up, its value in ``box``."""

    def train_loop_per_worker() -> None:
        import ray.train

        _local_tf_config()
        threads = set_threads_from_ray()
        logger.info("TF threads: %d intra-op, %d inter-op", threads, max(threads, 2))
        value = fn(*args)
        ray.get(box.put.remote(ray.train.get_context().get_world_rank(), value))

    return train_loop_per_worker


def _collect_outputs(ray: Any, box: Any, fewest: int, most: int) -> list[Any]:
    """Every rank's return value from ``box``, rank 0 first; then ``box`` is freed."""
    results = ray.get(box.get.remote())
    ray.kill(box)
    # An elastic group's last attempt had any size in the range: as many outputs as it had ranks.
    ranks = range(most) if fewest == most else sorted(results)
    return [results.get(rank) for rank in ranks]


def ray_launcher(fn: Callable[..., Any], *args: Any, **options: Any) -> Any:
    """``notebook_launcher`` on Ray Train: runs ``fn(*args)``, returns the chief's result.

    Starts a local loopback Ray cluster (no dashboard) unless Ray is already
    initialised or ``RAY_ADDRESS`` names a cluster. The keyword arguments are
    `ray_fit`'s, with the same defaults (``num_workers=2``, ...);
    ``ray_fit`` also returns Ray's ``Result``.
    """
    return ray_fit(fn, *args, **options).outputs[0]


# help() and editors show ray_fit's keyword arguments, which ray_launcher takes.
ray_launcher.__signature__ = inspect.signature(ray_fit).replace(  # type: ignore[attr-defined]
    return_annotation=Any
)
