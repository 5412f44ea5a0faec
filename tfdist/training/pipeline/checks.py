"""The refusals of ``Trainer(pipeline=...)``: one clear error each, before anything trains.

`check_pipeline_options` runs before the model is made (the strategy, ``sharding=``);
`check_pipeline_model` once it is compiled (its own ``train_step``, BatchNormalization,
the cut, the devices); `check_global_batch` for each fit's batch.

The strategies a pipeline runs under: the default one (all stages in this process), and one
whose runner is a `tfdist.strategies.base.HybridRunner` (``multi_worker``) with one replica per
worker (the hybrid: data parallel over the workers, each worker's replica a pipeline over its
own devices).
"""

from __future__ import annotations

from typing import Any

import keras

from tfdist._compat.tf_internals.runtime import is_default_strategy
from tfdist.config import invalid_argument
from tfdist.strategies.base import HybridRunner, Runner
from tfdist.training.pipeline.cut import Cuts
from tfdist.training.pipeline.options import PipelineOptions, resolve_devices, split_names
from tfdist.training.step.model_steps import overridden


def _all_layers(layer: Any) -> list[Any]:
    found = []
    for sub in getattr(layer, "layers", []) or []:
        found.append(sub)
        found.extend(_all_layers(sub))
    return found


def check_pipeline_options(
    options: Any, runner: Runner, sharding: str | None
) -> PipelineOptions | None:
    """The Trainer's refusals of ``pipeline=`` before the model is made (``runner``: the
    strategy's); returns ``options``."""
    if options is None:
        return None
    if not isinstance(options, PipelineOptions):
        raise invalid_argument("pipeline", options, "a tfdist.PipelineOptions or None")
    hybrid = isinstance(runner, HybridRunner)
    if not is_default_strategy(runner.strategy) and not hybrid:
        raise invalid_argument(
            "strategy",
            type(runner.strategy).__name__,
            "None (the default strategy: all stages in this process) or a "
            "MultiWorkerMirroredStrategy (data parallel over workers x stages) with pipeline=",
            note="Pipeline stages place each stage's variables on its own device; mirrored and "
            "one_device make every variable on their replicas' devices, and parameter_server on "
            "its ps tasks.",
        )
    if hybrid and len(runner.replica_devices) != 1:
        raise invalid_argument(
            "strategy",
            f"MultiWorkerMirroredStrategy with {len(runner.replica_devices)} replicas per worker",
            "one replica per worker with pipeline= (its devices hold the stages)",
            note='Make it with tfdist.make_strategy("multi_worker", stage_devices=K), which '
            "leaves one device per worker to the replica and the others to the stages.",
        )
    if sharding is not None and not hybrid:
        raise invalid_argument(
            "sharding",
            sharding,
            "None with pipeline= under the default strategy",
            note="Sharded optimizer state splits each variable over the replicas; a pipeline in "
            "one process has one replica, whose stages each hold their own variables' "
            "optimizer state on their own device already. The hybrid (multi_worker) shards it "
            "over the workers.",
        )
    return options


def check_pipeline_model(
    options: PipelineOptions | None, model: Any, runner: Runner
) -> list[str] | None:
    """The refusals that need the compiled model; returns each stage's device (None: no
    pipeline)."""
    if options is None:
        return None
    if overridden(model, "train_step"):
        raise invalid_argument(
            "pipeline",
            options,
            "None for a model with its own train_step",
            note=f"{type(model).__name__}.train_step would run the whole model as one; the "
            "pipeline's schedule is tfdist's own step.",
        )
    check_batch_norm(model, options)
    if model.built:
        names = split_names(model, options)
        Cuts(model, names).positions(names)  # the cut checked before anything trains
    worker = runner.replica_devices[0] if isinstance(runner, HybridRunner) else None
    return resolve_devices(options, worker_device=worker)


def check_batch_norm(model: keras.Model, options: PipelineOptions) -> None:
    """Refuses BatchNormalization with ``micro_batches > 1`` unless accepted."""
    if options.micro_batches == 1 or options.allow_batch_norm:
        return
    batch_norm = keras.layers.BatchNormalization
    norms = [x.name for x in _all_layers(model) if isinstance(x, batch_norm)]
    if norms:
        raise invalid_argument(
            "micro_batches",
            options.micro_batches,
            f"1 for a model with BatchNormalization ({', '.join(norms[:3])})",
            note="Its statistics would be those of each micro-batch, not of the global batch. "
            "Pass PipelineOptions(allow_batch_norm=True) to accept that.",
        )


def check_global_batch(
    global_batch_size: int, options: PipelineOptions, num_replicas: int = 1
) -> None:
    """Refuses a global batch that ``micro_batches`` times the replicas does not divide."""
    m = options.micro_batches * num_replicas
    if global_batch_size % m:
        lower = max(m, global_batch_size - global_batch_size % m)
        per = f" on each of {num_replicas} replicas" if num_replicas > 1 else ""
        raise invalid_argument(
            "global_batch_size",
            global_batch_size,
            f"a multiple of micro_batches={options.micro_batches}"
            + (f" x {num_replicas} replicas" if num_replicas > 1 else "")
            + f", e.g. {lower} or {lower + m}",
            note=f"Each replica's batch is split into micro_batches equal micro-batches{per} "
            "(batch_size is the same argument).",
        )
