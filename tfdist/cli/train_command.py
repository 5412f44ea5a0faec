"""``tfdist train``: this process trains (one task of ``tfdist launch``), or a Ray Train group does.

The job itself is `tfdist.launch.train`; it imports TensorFlow, so it loads only here,
when the command runs.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Sequence
from typing import Any

from tfdist import quiet
from tfdist.cli.flag_definitions import ENGINES, FLAGS
from tfdist.config import GRADIENT_COMPRESSIONS, TrainConfig, invalid_argument


def _steps_per_execution(flag: str) -> int | str:
    """``--steps_per_execution``: ``auto`` as is, digits as an int, anything else as given.

    TrainConfig refuses what is neither a positive int nor ``auto``, naming the argument.
    """
    return int(flag) if flag.strip().isdigit() else flag


def _gradient_compression() -> str | None:
    """``--gradient_compression``'s one value for ``train`` (a list flag: bench takes several)."""
    values = FLAGS.gradient_compression
    if values is None:
        return None
    if len(values) != 1:
        raise invalid_argument(
            "gradient_compression",
            ",".join(values),
            "one value for `tfdist train`: " + ", ".join(GRADIENT_COMPRESSIONS),
            note="Several values (variants to compare) are for `tfdist bench`.",
        )
    return values[0]


#: The flags that choose or shape a strategy: with ``--pipeline`` only ``--strategy=multi_worker``
#: (the hybrid) and its ``--communication`` go.
STRATEGY_FLAGS = ("strategy", "num_devices", "communication", "num_workers", "num_ps")
STRATEGY_FLAGS += ("min_shard_bytes",)
HYBRID_FLAGS = ("strategy", "communication")


def _strategy() -> str | None:
    """``--strategy``; None (TF's default strategy) for ``--pipeline`` without a strategy flag.

    A pipeline trains in one process with the stages on its devices, which a strategy's scope
    would override, or, with ``--strategy=multi_worker``, in each worker of the cluster (the
    hybrid); any other flag of the strategy group is refused with it, by name.
    """
    if FLAGS.pipeline in ("", "off"):
        return FLAGS.strategy
    hybrid = FLAGS["strategy"].present and FLAGS.strategy == "multi_worker"
    for name in STRATEGY_FLAGS:
        if FLAGS[name].present and not (hybrid and name in HYBRID_FLAGS):
            raise invalid_argument(
                name,
                FLAGS[name].value,
                f"no --{name} with --pipeline"
                + (" (only --strategy=multi_worker, the hybrid)" if name == "strategy" else ""),
                note="A pipeline trains in one process under TensorFlow's default strategy, "
                "each stage on its own device, or with --strategy=multi_worker in each worker "
                "of a cluster (data parallel over the workers x stages in each).",
            )
    return "multi_worker" if hybrid else None


def train_config() -> TrainConfig:
    """The ``TrainConfig`` the parsed flags describe (checked by ``TrainConfig`` itself)."""
    return TrainConfig(
        strategy=_strategy(),
        num_devices=FLAGS.num_devices,
        communication=FLAGS.communication,
        num_workers=FLAGS.num_workers,
        num_ps=FLAGS.num_ps,
        min_shard_bytes=FLAGS.min_shard_bytes,
        model=FLAGS.model,
        dataset=FLAGS.dataset,
        data_dir=FLAGS.data_dir,
        epochs=FLAGS.epochs,
        global_batch_size=FLAGS.global_batch_size,
        steps_per_epoch=FLAGS.steps_per_epoch,
        precision=FLAGS.precision,
        steps_per_execution=_steps_per_execution(FLAGS.steps_per_execution),
        accumulation_steps=FLAGS.accumulation_steps,
        optimizer=FLAGS.optimizer,
        learning_rate=FLAGS.learning_rate,
        lr_scaling=FLAGS.lr_scaling,
        base_global_batch_size=FLAGS.base_global_batch_size,
        warmup_steps=FLAGS.warmup_steps,
        warmup_epochs=FLAGS.warmup_epochs,
        model_dir=FLAGS.model_dir,
        backup_dir=FLAGS.backup_dir,
        backup_freq=FLAGS.backup_freq,
        seed=FLAGS.seed,
        verbose=FLAGS.verbose,
        watchdog=FLAGS.watchdog,
        stragglers=FLAGS.stragglers,
        gradient_compression=_gradient_compression(),
        bucket_bytes=FLAGS.bucket_bytes,
        sharding=FLAGS.sharding,
        pipeline=FLAGS.pipeline,
        balance=FLAGS.balance,
    )


def check_pipeline(config: TrainConfig) -> None:
    """Refuses ``--pipeline`` in a cluster (TF_CONFIG or Slurm) and checks its pairs, before
    TensorFlow loads; the layer names are checked by the Trainer once the model is made."""
    if not config.pipeline or config.pipeline == "off":
        return
    from tfdist import cluster
    from tfdist.launch.pipeline_flag import pipeline_options

    if cluster.from_environment() is not None and config.strategy != "multi_worker":
        raise invalid_argument(
            "pipeline",
            config.pipeline,
            "off in a task of a cluster (TF_CONFIG or Slurm describes one), unless with "
            "--strategy=multi_worker",
            note="Without a strategy a pipeline trains in one process; with "
            "--strategy=multi_worker each worker of the cluster runs one (the hybrid).",
        )
    pipeline_options(config)


def _check_parameter_server_steps(config: TrainConfig) -> None:
    """Refuses parameter_server without ``--steps_per_epoch`` before a cluster starts.

    The Trainer refuses it too, but only after TensorFlow loaded and the in-process cluster's
    servers started listening. ``--strategy=auto`` counts as parameter_server where TF_CONFIG
    (or Slurm) describes a cluster with ``ps`` tasks, as ``make_strategy("auto")`` decides.
    """
    kind = config.strategy
    if kind == "auto":
        from tfdist import cluster

        info = cluster.from_environment()
        if info is not None and "ps" in info.cluster:
            kind = "parameter_server"
    if kind == "parameter_server" and config.steps_per_epoch is None:
        raise invalid_argument(
            "steps_per_epoch",
            None,
            "a positive integer with --strategy=parameter_server",
            note="Its workers read their datasets independently and repeat them, so an epoch has "
            "no natural end: say how many batches make one, e.g. --steps_per_epoch=25.",
        )


def _train_on_this_worker(config: TrainConfig) -> dict[str, Any]:
    """``train.run`` on a Ray worker. Ray pickles this function by reference, so the CLI process
    (which only drives the group) never loads TensorFlow."""
    quiet.quiet_loggers()  # as the CLI does: else every worker logs each all-reduce it sets up
    quiet.import_tensorflow()
    from tfdist.launch import train

    return train.run(config)


def run(args: Sequence[str]) -> int:
    """Runs ``tfdist train``; prints the final figures.

    Returns:
        The exit code, 0.
    """
    if args:
        raise invalid_argument(
            "args",
            list(args),
            "no positional arguments for `tfdist train`",
            note="Options are flags, e.g. --epochs=5.",
        )
    if FLAGS.engine not in ENGINES:
        raise invalid_argument("engine", FLAGS.engine, ENGINES)
    # The flags are checked before TensorFlow loads (seconds), so a bad one fails at once.
    config = train_config()
    if FLAGS.engine == "ray":
        if FLAGS.pipeline not in ("", "off"):
            raise invalid_argument(
                "pipeline",
                FLAGS.pipeline,
                "off with --engine=ray",
                note="Ray Train runs multi_worker groups; a pipeline trains in one process.",
            )
        if FLAGS.strategy != "multi_worker" and FLAGS["strategy"].present:
            raise invalid_argument(
                "strategy",
                FLAGS.strategy,
                "multi_worker with --engine=ray",
                note="Ray Train runs all-worker groups (MultiWorkerMirroredStrategy).",
            )
        if not sys.stdout.isatty():  # a log: Ray's repeated-line notes come in colour; write all
            os.environ.setdefault("RAY_DEDUP_LOGS", "0")  # read when Ray is imported, next
        from tfdist.launch.ray.engine import ray_launcher

        summary = ray_launcher(
            _train_on_this_worker,
            # Each Ray worker is one multi_worker task.
            dataclasses.replace(config, strategy="multi_worker", num_workers=None),
            num_workers=config.num_workers or 2,
            cpus_per_worker=FLAGS.cpus_per_worker,
            max_failures=FLAGS.max_restarts,
        )
    else:
        _check_parameter_server_steps(config)
        check_pipeline(config)
        quiet.import_tensorflow()
        from tfdist.launch import train

        summary = train.run(config)
    if summary["is_chief"]:
        print(
            f"final val_accuracy={summary['val_accuracy']:.4f} val_loss={summary['val_loss']:.4f} "
            f"replicas={summary['num_replicas']} train_seconds={summary['seconds']:.1f}"
        )
    # Every task reports its update count and weights, so a job's logs show that the workers agree.
    print(
        f"final updates={summary['updates']} weights_digest={summary['weights_digest']}", flush=True
    )
    return 0
