"""The ``tfdist train`` job: strategy, data, model, Trainer, report.

Run it with ``make train``, ``tfdist train --strategy=mirrored --num_devices=2``,
or on a local cluster with
``tfdist launch --workers=2 -- tfdist train --strategy=multi_worker``.
With ``--pipeline=split_at=conv_1,micro_batches=4`` the model is cut into pipeline stages
in this one process (TF's default strategy), each stage on a GPU, else on a logical CPU
device made here. With ``--backup_dir=DIR [--backup_freq=N]`` a restarted run resumes at
the last backed-up update, e.g. under Slurm with requeue on preemption::

    tfdist manifest slurm --ntasks=2 --max_restarts=3 --output=job.sbatch -- \
        tfdist train --strategy=multi_worker --backup_dir=$HOME/run/backup --backup_freq=50
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import time
from typing import Any

from tfdist.config import (
    BALANCE_FIELDS,
    STRAGGLER_FIELDS,
    WATCHDOG_FIELDS,
    TrainConfig,
    parse_options,
)
from tfdist.launch.pipeline_flag import pipeline_options, stage_cpu_devices

logger = logging.getLogger(__name__)


def _strategy_options(config: TrainConfig) -> dict[str, Any]:
    if config.strategy == "mirrored":
        return {"num_devices": config.num_devices}
    if config.strategy == "multi_worker":
        return {"communication": config.communication}
    if config.strategy == "parameter_server":
        options = {
            "num_workers": config.num_workers,
            "num_ps": config.num_ps,
            "min_shard_bytes": config.min_shard_bytes,
        }
        return {k: v for k, v in options.items() if v is not None}
    return {}


def health_options(config: TrainConfig) -> dict[str, Any]:
    """The Trainer's ``watchdog`` and ``stragglers`` from the config's flags (absent: defaults)."""
    from tfdist.training.health.stragglers import StragglerOptions
    from tfdist.training.health.watchdog import WatchdogOptions

    options: dict[str, Any] = {}
    for name, kind, fields in (
        ("watchdog", WatchdogOptions, WATCHDOG_FIELDS),
        ("stragglers", StragglerOptions, STRAGGLER_FIELDS),
    ):
        text = getattr(config, name)
        if text:
            kwargs = parse_options(name, text, fields)
            options[name] = None if kwargs is None else kind(**kwargs)
    return options


def balance_options(config: TrainConfig) -> Any:
    """The Trainer's ``balance`` from ``--balance`` (False: off)."""
    from tfdist.training.balance.balancer import BalanceOptions

    kwargs = parse_options("balance", config.balance or "off", BALANCE_FIELDS)
    return False if kwargs is None else BalanceOptions(**kwargs)


def _backup_options(config: TrainConfig) -> dict[str, Any]:
    """The Trainer's ``backup_dir`` and ``backup_freq`` (default: every epoch), if any."""
    if not config.backup_dir:
        return {}
    freq = config.backup_freq if config.backup_freq is not None else "epoch"
    return {"backup_dir": config.backup_dir, "backup_freq": freq}


def exchange_options(config: TrainConfig) -> dict[str, Any]:
    """The Trainer's ``gradient_compression``, ``bucket_bytes`` and ``sharding`` (None: its
    defaults)."""
    return {
        "gradient_compression": config.gradient_compression,
        "bucket_bytes": config.bucket_bytes,
        "sharding": config.sharding,
    }


def run(config: TrainConfig) -> dict[str, Any]:
    """Trains ``config.model`` on ``config.dataset`` and returns a summary.

    Returns:
        A dict with ``val_accuracy``, ``val_loss``, ``history``, ``seconds``,
        ``is_chief``, ``num_replicas``, ``updates`` (the optimizer's update
        count, backed-up updates of an earlier attempt included) and
        ``weights_digest`` (a SHA-256 prefix of the weights, equal on every
        worker of a synchronous run).

    Raises:
        SystemExit: With code 75 after SIGTERM when ``config.backup_dir`` is
            set: the backup is saved and the run asks to be restarted.
    """
    # Only tfdist's public names: the job is what a user's script would be. The strategy comes
    # first, before other TF work (virtual devices and collectives must be set up before TF starts).
    import tensorflow as tf

    import tfdist

    pipeline = pipeline_options(config)
    if pipeline is not None and config.strategy == "multi_worker":  # the hybrid
        stages = stage_cpu_devices(pipeline)
        strategy = tfdist.make_strategy(
            "multi_worker", communication=config.communication, stage_devices=stages
        )
    elif pipeline is not None:  # TF's default strategy; the stages' devices
        stage_cpu_devices(pipeline)
        strategy = tf.distribute.get_strategy()
    else:
        strategy = tfdist.make_strategy(config.strategy, **_strategy_options(config))

    import keras

    from tfdist import data

    keras.utils.set_random_seed(config.seed)
    train = data.load(config.dataset, split="train", data_dir=config.data_dir, seed=config.seed)
    val = data.load(config.dataset, split="validation", data_dir=config.data_dir, seed=config.seed)
    trainer = _make_trainer(config, strategy, train, pipeline)
    start = time.perf_counter()
    history = trainer.fit(
        train,
        epochs=config.epochs,
        steps_per_epoch=config.steps_per_epoch,
        global_batch_size=config.global_batch_size,
        validation_data=val,
        verbose=config.verbose if trainer.is_chief else 0,
    )
    seconds = time.perf_counter() - start
    if config.model_dir:
        _save(trainer, config.model_dir)
    return _summary(trainer, strategy, history, seconds)


def _make_trainer(
    config: TrainConfig, strategy: Any, train: Any, pipeline: dict[str, Any] | None
) -> Any:
    """The Trainer of ``config.model`` for the ``train`` dataset, under ``strategy``, with the
    ``pipeline``'s stages (`pipeline_options`) if any."""
    import keras

    import tfdist
    from tfdist import models

    optimizer = keras.optimizers.get(
        {"class_name": config.optimizer, "config": {"learning_rate": config.learning_rate}}
    )
    return tfdist.Trainer(
        lambda: models.get(
            config.model, input_shape=train.input_shape, num_classes=train.num_classes
        ),
        strategy=strategy,
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        precision=config.precision,
        accumulation_steps=config.accumulation_steps,
        steps_per_execution=config.steps_per_execution,
        lr_scaling=config.lr_scaling,
        base_global_batch_size=config.base_global_batch_size,
        warmup_steps=config.warmup_steps,
        warmup_epochs=config.warmup_epochs,
        **_backup_options(config),
        **exchange_options(config),
        **health_options(config),
        pipeline=None if pipeline is None else tfdist.PipelineOptions(**pipeline),
        balance=balance_options(config),
    )


def _summary(trainer: Any, strategy: Any, history: Any, seconds: float) -> dict[str, Any]:
    """The run's summary (see `run`) from the fit's history and the trained model."""
    return {
        "val_accuracy": float(history.history["val_accuracy"][-1]),
        "val_loss": float(history.history["val_loss"][-1]),
        "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
        "seconds": seconds,
        "is_chief": trainer.is_chief,
        "num_replicas": strategy.num_replicas_in_sync,
        "updates": int(trainer.model.optimizer.iterations.numpy()),
        "weights_digest": _digest(trainer.model.get_weights()),
    }


def _digest(weights: list[Any]) -> str:
    """A short SHA-256 of the weights' bytes, to compare workers' final weights."""
    sha = hashlib.sha256()
    for w in weights:
        sha.update(w.tobytes())
    return sha.hexdigest()[:16]


def _save(trainer: Any, model_dir: str) -> None:
    """Saves ``model.keras``; only the chief writes ``model_dir``, others a temp dir."""
    target = model_dir if trainer.is_chief else tempfile.mkdtemp(prefix="tfdist-save-")
    os.makedirs(target, exist_ok=True)
    trainer.model.save(os.path.join(target, "model.keras"))
    if not trainer.is_chief:
        shutil.rmtree(target, ignore_errors=True)
    else:
        logger.info("Saved the model to %s", os.path.join(model_dir, "model.keras"))
