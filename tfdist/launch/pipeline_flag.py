"""``tfdist train --pipeline=...``: the flag's text as ``PipelineOptions``'s arguments, and the
stages' logical CPU devices.

``--pipeline=split_at=conv_1,micro_batches=4`` cuts the model after layer ``conv_1`` into two
stages trained with the GPipe schedule over 4 micro-batches (`tfdist.training.pipeline.options`),
in one
process under TensorFlow's default strategy, or with ``--strategy=multi_worker`` in each worker of
a cluster (the hybrid). Several split names (and ``devices``) are joined by
``+``, since commas separate the pairs: ``split_at=conv_0+dense``; ``split_at=auto,stages=K`` lets
tfdist choose ``K - 1`` cuts by parameter bytes. Importing this module loads
no TensorFlow, so that ``tfdist train`` checks the flag before TensorFlow starts.
"""

from __future__ import annotations

import logging
from typing import Any

from tfdist.config import PIPELINE_FIELDS, TrainConfig, invalid_argument, parse_options

logger = logging.getLogger(__name__)


def pipeline_options(config: TrainConfig) -> dict[str, Any] | None:
    """``PipelineOptions``'s keyword arguments from ``--pipeline`` (None: no pipeline).

    ``split_at`` and ``devices`` hold several values joined by ``+`` (``split_at=conv_0+dense``).
    Checked here, before TensorFlow loads; the Trainer checks the names against the model.
    """
    text = config.pipeline
    kwargs = parse_options("pipeline", text or "off", PIPELINE_FIELDS, on=False)
    if kwargs is None:
        return None
    kwargs.update({k: kwargs[k].split("+") for k in ("split_at", "devices") if k in kwargs})
    names = kwargs.get("split_at", [""])
    if names == ["auto"]:
        kwargs["split_at"] = "auto"
        if kwargs.get("stages", 0) < 2:
            raise invalid_argument("pipeline", text, "stages=K (at least 2) with split_at=auto")
        names = [""] * (kwargs["stages"] - 1)  # the count of cuts; tfdist chooses them
    elif not all(names) or len(set(names)) < len(names) or "stages" in kwargs:
        raise invalid_argument(
            "pipeline",
            text,
            "split_at=NAME or split_at=NAME+NAME+..., distinct layer names (or split_at=auto "
            "with stages=K)",
        )
    if kwargs.get("schedule", "gpipe") not in ("gpipe", "1f1b"):
        raise invalid_argument("pipeline", text, "schedule=gpipe or schedule=1f1b")
    if kwargs.setdefault("micro_batches", 1) < 1:
        raise invalid_argument("pipeline", text, "micro_batches= to be a positive integer")
    if len(kwargs.get("devices", names + [""])) != len(names) + 1:
        raise invalid_argument(
            "pipeline",
            text,
            f"devices= one device per stage joined by '+' ({len(names) + 1} for "
            f"{len(names)} split(s)), e.g. devices=/cpu:0+/cpu:1",
        )
    if config.global_batch_size % kwargs["micro_batches"]:
        raise invalid_argument(
            "global_batch_size",
            config.global_batch_size,
            f"a multiple of the pipeline's micro_batches={kwargs['micro_batches']}",
        )
    return kwargs


def stage_cpu_devices(options: dict[str, Any]) -> int:
    """Splits the CPU into one logical device per stage (or up to the highest CPU named in
    ``devices``) on a host without GPUs; must run before TensorFlow initialises its devices.

    Returns:
        The devices the stages need (``stage_devices`` for the hybrid's strategy).
    """
    import tensorflow as tf

    wanted = options.get("stages") or len(options["split_at"]) + 1
    if tf.config.list_physical_devices("GPU"):
        return wanted
    for name in options.get("devices") or []:
        try:
            spec = tf.DeviceSpec.from_string(name)
        except ValueError:
            continue  # the Trainer refuses it, naming this process's devices
        if (spec.device_type or "").upper() == "CPU":
            wanted = max(wanted, (spec.device_index or 0) + 1)
    cpu = tf.config.list_physical_devices("CPU")[0]
    have = len(tf.config.get_logical_device_configuration(cpu) or [None])
    if wanted <= have:
        return wanted
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * wanted
        )
    except RuntimeError as e:  # TensorFlow initialised its devices already
        raise invalid_argument(
            "pipeline",
            options,
            f"at most {have} stages on this process's {have} logical CPU device(s)",
            note="Logical CPU devices are made only before TensorFlow initialises: run the "
            "pipeline first in the process, or pass devices= that exist.",
        ) from e
    logger.info("Split the CPU into %d logical devices, one per pipeline stage", wanted)
    return wanted
