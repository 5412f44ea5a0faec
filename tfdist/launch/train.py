"""The ``tfdist train`` job: strategy, data, model, Trainer, report.

Run it with ``make train``, ``tfdist train --strategy=mirrored --num_devices=2``,
``tfdist train --model=gpt --dataset=python_source`` (a byte-level GPT on the Python standard
library's source, in bits per byte, with a sample of its text at the end),
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
    LOCAL_SGD_FIELDS,
    MODEL_OPTION_FIELDS,
    STRAGGLER_FIELDS,
    WATCHDOG_FIELDS,
    TrainConfig,
    parse_options,
)
from tfdist.launch.pipeline_flag import pipeline_options, stage_cpu_devices

logger = logging.getLogger(__name__)

#: The models that read bytes and write next-byte logits at every position: they are measured in
#: bits per byte (`tfdist.models.language.BitsPerByte`) and write a sample at the end.
LANGUAGE_MODELS = ("gpt",)
#: The sample a language model writes at the end of its run (chief only): its prompt, its length
#: in bytes, its temperature and seed.
SAMPLE_PROMPT, SAMPLE_BYTES, SAMPLE_TEMPERATURE, SAMPLE_SEED = b"def ", 300, 0.8, 0


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


def local_sgd_options(config: TrainConfig) -> Any:
    """The Trainer's ``local_sgd`` from ``--local_sgd`` (None: off): ``outer=nesterov`` is
    DiLoCo's ``SGD(0.7, momentum=0.9, nesterov=True)``, ``outer=sgd`` ``SGD(0.7)``; the
    ``outer_learning_rate`` and ``outer_momentum`` pairs replace those numbers;
    ``adapt_to_stragglers=true`` and ``fragments=K`` pass on."""
    kwargs = parse_options("local_sgd", config.local_sgd or "off", LOCAL_SGD_FIELDS, on=False)
    if kwargs is None:
        return None
    import keras

    import tfdist

    outer, optimizer = kwargs.get("outer", "none"), None
    if outer != "none":
        nesterov = outer == "nesterov"
        optimizer = keras.optimizers.SGD(
            kwargs.get("outer_learning_rate", 0.7),
            momentum=kwargs.get("outer_momentum", 0.9 if nesterov else 0.0),
            nesterov=nesterov,
        )
    adapt = kwargs.get("adapt_to_stragglers", False)
    fragments = kwargs.get("fragments", 1)
    return tfdist.LocalSGDOptions(
        kwargs["sync_every"],
        outer_optimizer=optimizer,
        adapt_to_stragglers=adapt,
        fragments=fragments,
    )


def _backup_options(config: TrainConfig) -> dict[str, Any]:
    """The Trainer's ``backup_dir`` and ``backup_freq`` (default: every epoch), if any."""
    if not config.backup_dir:
        return {}
    freq = config.backup_freq if config.backup_freq is not None else "epoch"
    return {"backup_dir": config.backup_dir, "backup_freq": freq}


def dataset_options(config: TrainConfig, split: str) -> dict[str, Any]:
    """``data.load``'s options for ``split`` from the flags that set them (python_source:
    ``seq_len``; ``max_bytes`` of the training text, and at most as many of the validation text
    as its default); an unset one keeps the dataset's default."""
    options = {"seq_len": config.seq_len, "max_bytes": config.max_bytes}
    if split != "train" and config.max_bytes is not None:
        from tfdist.data.text import DEFAULT_MAX_BYTES

        options["max_bytes"] = min(config.max_bytes, DEFAULT_MAX_BYTES["validation"])
    return {name: value for name, value in options.items() if value is not None}


def model_options(config: TrainConfig) -> dict[str, Any]:
    """``models.get``'s options from ``--model_options`` (e.g. gpt's ``width``, ``depth``,
    ``heads``); none: the model's defaults."""
    return parse_options("model_options", config.model_options, MODEL_OPTION_FIELDS) or {}


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
        worker of a synchronous run); for a language model (`LANGUAGE_MODELS`) also
        ``val_bits_per_byte`` and, on the chief, ``sample``: `SAMPLE_PROMPT` and the
        bytes it writes after it.

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
    train, val = (
        data.load(
            config.dataset,
            split=split,
            data_dir=config.data_dir,
            seed=config.seed,
            **dataset_options(config, split),
        )
        for split in ("train", "validation")
    )
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
    summary = _summary(trainer, strategy, history, seconds)
    if config.model in LANGUAGE_MODELS and trainer.is_chief:
        summary["sample"] = SAMPLE_PROMPT + _sample(trainer.model)
    return summary


def _make_trainer(
    config: TrainConfig, strategy: Any, train: Any, pipeline: dict[str, Any] | None
) -> Any:
    """The Trainer of ``config.model`` for the ``train`` dataset, under ``strategy``, with the
    ``pipeline``'s stages (`pipeline_options`) if any."""
    import keras

    import tfdist
    from tfdist import models
    from tfdist.models.language import BitsPerByte

    metrics: list[Any] = ["accuracy"]
    if config.model in LANGUAGE_MODELS:
        metrics.append(BitsPerByte())
    options = model_options(config)
    optimizer = keras.optimizers.get(
        {"class_name": config.optimizer, "config": {"learning_rate": config.learning_rate}}
    )
    return tfdist.Trainer(
        lambda: models.get(
            config.model, input_shape=train.input_shape, num_classes=train.num_classes, **options
        ),
        strategy=strategy,
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=metrics,
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
        local_sgd=local_sgd_options(config),
    )


#: The last epoch's logs a summary reports (``val_bits_per_byte``: language models only).
_SUMMARY_LOGS = ("val_accuracy", "val_loss", "val_bits_per_byte")


def _summary(trainer: Any, strategy: Any, history: Any, seconds: float) -> dict[str, Any]:
    """The run's summary (see `run`) from the fit's history and the trained model."""
    last = {k: float(history.history[k][-1]) for k in _SUMMARY_LOGS if k in history.history}
    return {
        **last,
        "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
        "seconds": seconds,
        "is_chief": trainer.is_chief,
        "num_replicas": strategy.num_replicas_in_sync,
        "updates": int(trainer.model.optimizer.iterations.numpy()),
        "weights_digest": _digest(trainer.model.get_weights()),
    }


def _sample(model: Any) -> bytes:
    """The bytes a language model writes after `SAMPLE_PROMPT`, logged with their settings."""
    from tfdist.models.language import generate

    start = time.perf_counter()
    text = generate(
        model, SAMPLE_PROMPT, SAMPLE_BYTES, temperature=SAMPLE_TEMPERATURE, seed=SAMPLE_SEED
    )
    logger.info(
        "Sampled %d bytes after %r at temperature %s in %.1f s.",
        SAMPLE_BYTES,
        SAMPLE_PROMPT,
        SAMPLE_TEMPERATURE,
        time.perf_counter() - start,
    )
    return text


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
