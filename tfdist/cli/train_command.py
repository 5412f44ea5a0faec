"""``tfdist train``: this process trains (one task of ``tfdist launch``), or a Ray Train group does.

The job itself is `tfdist.launch.train`; it imports TensorFlow, so it loads only here,
when the command runs.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from tfdist import quiet
from tfdist.cli.flag_definitions import ENGINES, FLAGS, READS
from tfdist.config import GRADIENT_COMPRESSIONS, TrainConfig, invalid_argument

logger = logging.getLogger(__name__)

#: A model's own defaults for the flags the user did not set (the image models have none: the
#: flags' defaults are theirs). gpt: a byte-level GPT on the Python standard library's source
#: that trains in about 5 minutes on 2 CPU cores (docs/command-line.md gives its figures), on
#: one device, which is faster on 2 cores than 2 replicas (unless a strategy flag or --pipeline
#: says how to distribute).
MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "gpt": {
        "strategy": "one_device",
        "dataset": "python_source",
        "epochs": 5,
        "steps_per_epoch": 400,
        "global_batch_size": 32,
        "learning_rate": 5e-3,
        "warmup_steps": 50,
        "seq_len": 128,
        "max_bytes": 8_000_000,
        "model_options": "width=64,depth=2,heads=4",
    }
}


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


def _model_defaults() -> dict[str, Any]:
    """`MODEL_DEFAULTS` of ``--model`` for the flags not given, logged. No default strategy
    where a strategy flag or ``--pipeline`` says how to distribute, and no default warmup
    steps with ``--warmup_epochs``."""
    given = {name for name in READS["train"] if FLAGS[name].present}
    if given & set(STRATEGY_FLAGS) or FLAGS.pipeline not in ("", "off"):
        given.add("strategy")
    if "warmup_epochs" in given:
        given.add("warmup_steps")
    defaults = MODEL_DEFAULTS.get(FLAGS.model, {})
    chosen = {name: value for name, value in defaults.items() if name not in given}
    if chosen:
        pairs = " ".join(f"--{name}={value}" for name, value in chosen.items())
        logger.info("--model=%s defaults: %s", FLAGS.model, pairs)
    return chosen


def _check_dataset_options(config: TrainConfig) -> None:
    """Refuses python_source's options for another dataset, before TensorFlow loads."""
    for name in ("seq_len", "max_bytes"):
        if getattr(config, name) is not None and config.dataset != "python_source":
            raise invalid_argument(
                name,
                getattr(config, name),
                f"no --{name} with --dataset={config.dataset}",
                note="It sizes the byte windows of --dataset=python_source.",
            )


def train_config() -> TrainConfig:
    """The ``TrainConfig`` the parsed flags describe (checked by ``TrainConfig`` itself), with
    the model's `MODEL_DEFAULTS` for the flags not given."""
    config = dataclasses.replace(_flags_config(), **_model_defaults())
    _check_dataset_options(config)
    return config


def _flags_config() -> TrainConfig:
    """The ``TrainConfig`` of the flags as given, with their own defaults."""
    return TrainConfig(
        strategy=_strategy(),
        num_devices=FLAGS.num_devices,
        communication=FLAGS.communication,
        num_workers=FLAGS.num_workers,
        num_ps=FLAGS.num_ps,
        min_shard_bytes=FLAGS.min_shard_bytes,
        model=FLAGS.model,
        model_options=FLAGS.model_options,
        dataset=FLAGS.dataset,
        seq_len=FLAGS.seq_len,
        max_bytes=FLAGS.max_bytes,
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
        local_sgd=FLAGS.local_sgd,
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
        _print_chief_summary(summary)
    # Every task reports its update count and weights, so a job's logs show that the workers agree.
    print(
        f"final updates={summary['updates']} weights_digest={summary['weights_digest']}", flush=True
    )
    return 0


def _print_chief_summary(summary: dict[str, Any]) -> None:
    """The chief's lines: a language model's sample, then the final validation figures."""
    if "sample" in summary:
        print("sample:\n" + summary["sample"].decode("utf-8", errors="replace"), flush=True)
    bits = summary.get("val_bits_per_byte")
    print(
        f"final val_accuracy={summary['val_accuracy']:.4f} val_loss={summary['val_loss']:.4f} "
        + ("" if bits is None else f"val_bits_per_byte={bits:.4f} ")
        + f"replicas={summary['num_replicas']} train_seconds={summary['seconds']:.1f}"
    )
