"""Model parallelism by pipeline stages: options, devices, the cut, the stages' placement.

``Trainer(..., pipeline=tfdist.PipelineOptions(split_at=["block_2"], micro_batches=8))``
cuts a ``Sequential`` or functional Keras model at the named layers: stage ``k`` holds the
layers after split ``k-1`` up to and including split ``k``, and lives on device ``k``
(its variables, and the optimizer's slots for them, are made there). Each update splits the
replica's batch into ``micro_batches`` and runs the GPipe schedule in one ``tf.function``
(`tfdist.training.pipeline.update`): every micro-batch forward stage by stage, then backward
stage by stage, each stage's backward under its own device, gradients summed over the
micro-batches (the mean over the global batch, as Keras's), one optimizer update. TF's
dataflow executor overlaps stage ``k`` of micro-batch ``i`` with stage ``k-1`` of micro-batch
``i+1``. ``evaluate`` and ``predict`` run through the same stages.

Under the default strategy all stages are in this process. Under a MultiWorkerMirroredStrategy
with one replica per worker (the hybrid), each worker's replica is such a pipeline over the
worker's own devices; its stage variables are that strategy's mirrored variables, so the
gradients are all-reduced over the workers and every worker applies the same update.

What several stages need (a padding mask, an attention mask, position ids, a residual stream,
a Keras mask) crosses each cut with the activations, and a nested functional model (a KerasHub
backbone) is cut between its own layers, named ``"backbone/transformer_layer_0"``
(`tfdist.training.pipeline.cut`). Refused, one clear error each, naming the layer and listing
the cuts that would work: `tfdist.training.pipeline.cut`'s (a name the model does not have, a
layer called more than once, an empty stage) and `tfdist.training.pipeline.checks`'s.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from tfdist._compat.keras_internals.scope_moves import move_variables_to_device
from tfdist.config import check_choice, check_positive_int, invalid_argument
from tfdist.training.pipeline.cut import cut

logger = logging.getLogger(__name__)


#: ``split_at`` that asks tfdist to choose the cuts (`tfdist.training.pipeline.auto_split`).
AUTO = "auto"


@dataclasses.dataclass(frozen=True)
class PipelineOptions:
    """Pipeline stages over devices (model parallelism, GPipe schedule), checked when made.

    Args:
        split_at: Names of the layers after which the model is cut, in the model's order (a
            single name for two stages). Stage ``k`` ends with layer ``split_at[k]``; the last
            stage ends with the model's outputs. A layer inside a nested functional model
            called once (a KerasHub backbone inside the model) is named by its path,
            ``"backbone/transformer_layer_0"``: the nested model is flattened into the stages
            (its own name cuts after its last layer). Tensors that later stages read (a mask,
            position ids, a residual stream, a Keras mask) cross each cut with the activations.
            ``"auto"``: tfdist cuts the model into ``stages`` (or ``len(devices)``) stages of
            about equal parameter bytes.
        micro_batches: ``M``, the micro-batches each global batch is split into. The idle
            share of each device (the bubble) is ``(K-1)/(M+K-1)`` for ``K`` stages.
        devices: One device per stage, e.g. ``["/device:GPU:0", "/device:GPU:1"]``. Default:
            the host's first ``K`` GPUs, else (no GPU) its first ``K`` logical CPU devices.
        allow_batch_norm: Accept ``BatchNormalization`` with ``micro_batches > 1``: its batch
            statistics are then those of each micro-batch, not of the global batch.
        stages: ``K``, with ``split_at="auto"`` (default: one per device in ``devices``).
        schedule: ``"gpipe"`` (every forward, then every backward: activations of all ``M``
            micro-batches held) or ``"1f1b"`` (one forward, one backward in turn: at most ``K``
            micro-batches' activations per stage); the same bubble and the same weights.

    Raises:
        ValueError: For an empty or non-string ``split_at`` or a repeated name, a non-positive
            ``micro_batches``, ``devices`` not one string per stage, a non-bool
            ``allow_batch_norm``, or ``stages`` that is not at least 2 with ``"auto"`` (nor
            ``len(split_at) + 1`` with names).
    """

    split_at: Sequence[str] | str
    micro_batches: int = 1
    devices: Sequence[str] | None = None
    allow_batch_norm: bool = False
    stages: int | None = None
    schedule: str = "gpipe"

    def __post_init__(self) -> None:
        check_choice("schedule", self.schedule, ("gpipe", "1f1b"))
        if self.split_at == AUTO:
            stages = self._auto_stages()
        else:
            stages = self._named_stages()
        check_positive_int("micro_batches", self.micro_batches)
        if self.devices is not None:
            devices = self.devices
            if (
                not isinstance(devices, (list, tuple))
                or len(devices) != stages
                or not all(isinstance(d, str) and d for d in devices)
            ):
                splits = "auto" if self.split_at == AUTO else len(self.split_at)
                raise invalid_argument(
                    "devices",
                    devices,
                    f"None or a list of {stages} device names, one per stage "
                    f"({splits} split(s) in split_at)",
                )
            object.__setattr__(self, "devices", tuple(devices))
        if not isinstance(self.allow_batch_norm, bool):
            raise invalid_argument("allow_batch_norm", self.allow_batch_norm, "True or False")

    def _named_stages(self) -> int:
        split_at = (self.split_at,) if isinstance(self.split_at, str) else self.split_at
        if (
            not isinstance(split_at, (list, tuple))
            or not split_at
            or not all(isinstance(n, str) and n for n in split_at)
        ):
            raise invalid_argument(
                "split_at", self.split_at, "a non-empty list of layer names, or 'auto'"
            )
        if len(set(split_at)) != len(split_at):
            raise invalid_argument("split_at", self.split_at, "layer names, each once")
        object.__setattr__(self, "split_at", tuple(split_at))
        if self.stages is not None and self.stages != len(split_at) + 1:
            raise invalid_argument(
                "stages",
                self.stages,
                f"None or {len(split_at) + 1} (one more than the names in split_at)",
            )
        return len(split_at) + 1

    def _auto_stages(self) -> int:
        stages = self.stages
        if stages is None and isinstance(self.devices, (list, tuple)):
            stages = len(self.devices)
        if isinstance(stages, bool) or not isinstance(stages, int) or stages < 2:
            raise invalid_argument(
                "stages",
                self.stages,
                "an integer of at least 2 with split_at='auto' (or devices=, one per stage)",
            )
        object.__setattr__(self, "stages", stages)
        return stages

    @property
    def num_stages(self) -> int:
        """``K``: one more than the splits (``stages`` with ``"auto"``)."""
        if self.split_at == AUTO:
            return int(self.stages or 0)
        return len(self.split_at) + 1


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage: a functional sub-model sharing the model's layers, and its device."""

    model: keras.Model
    device: str

    @property
    def trainable_variables(self) -> list[Any]:
        return self.model.trainable_variables


def _local_names(kind: str) -> list[str]:
    return [d.name for d in tf.config.list_logical_devices(kind)]


def _known(device: str) -> bool:
    """Whether ``device`` names a logical device of this process (other jobs: not checked)."""
    try:
        spec = tf.DeviceSpec.from_string(device)
    except ValueError:
        return False
    if spec.job not in (None, "localhost"):
        return True  # another task's device: placed (and checked) by TF
    if spec.device_type is None:
        return False
    return (spec.device_index or 0) < len(_local_names(spec.device_type.upper()))


def resolve_devices(options: PipelineOptions, worker_device: str | None = None) -> list[str]:
    """The device of each stage: as given (checked), else the host's GPUs or logical CPUs.

    ``worker_device``: the hybrid's replica device (``/job:worker/replica:0/task:I/...``); each
    stage's device is then this worker's device of that name.
    """
    devices = _local_devices(options) if options.devices is None else _given_devices(options)
    if worker_device is None:
        return devices
    return [_on_worker(d, worker_device, options) for d in devices]


def _given_devices(options: PipelineOptions) -> list[str]:
    for device in options.devices or ():
        if not _known(device):
            raise invalid_argument(
                "devices",
                list(options.devices or ()),
                "devices of this process: " + ", ".join(_local_names("GPU") + _local_names("CPU")),
                note=f"{device!r} is not one of them.",
            )
    return list(options.devices or ())


def _local_devices(options: PipelineOptions) -> list[str]:
    k = options.num_stages
    gpus, cpus = _local_names("GPU"), _local_names("CPU")
    if len(gpus) >= k:
        return gpus[:k]
    if not gpus and len(cpus) >= k:
        return cpus[:k]
    raise invalid_argument(
        "devices",
        None,
        f"{k} devices, one per stage",
        note=f"This process has {len(gpus)} GPU(s) and {len(cpus)} logical CPU device(s). Pass "
        "devices=[...] (stages may share a device), or split the CPU with "
        "tf.config.set_logical_device_configuration before TensorFlow initialises "
        '(tfdist.make_strategy("multi_worker", stage_devices=K) does it for the hybrid).',
    )


def _on_worker(device: str, worker_device: str, options: PipelineOptions) -> str:
    """``device`` (this process's) as a full name on the hybrid's worker."""
    worker = tf.DeviceSpec.from_string(worker_device)
    spec = tf.DeviceSpec.from_string(device)
    if spec.job in (None, "localhost"):
        spec = spec.replace(job=None, replica=None, task=None)
    if (spec.job, spec.task) not in ((None, None), (worker.job, worker.task)):
        raise invalid_argument(
            "devices",
            list(options.devices or ()),
            f"devices of this worker ({worker.job} task {worker.task}) with multi_worker",
            note=f"{device!r} is another task's; in the hybrid each worker's stages are its own.",
        )
    return worker.make_merged_spec(spec).to_string()


def split_names(model: keras.Model, options: PipelineOptions) -> list[str]:
    """The layers to cut after: as given, or with ``"auto"`` chosen by parameter bytes."""
    if options.split_at != AUTO:
        return list(options.split_at)
    from tfdist.training.pipeline.auto_split import balanced_split

    return balanced_split(model, options.num_stages)


def _described(stage: Stage) -> str:
    names = [x.name for x in stage.model.layers if not isinstance(x, keras.layers.InputLayer)]
    size = sum(v.value.shape.num_elements() * v.value.dtype.size for v in stage.model.variables)
    shown = f"{size / 2**20:.1f} MB" if size >= 2**20 else f"{size / 2**10:.1f} kB"
    return f"{names[0]}..{names[-1]} on {stage.device} ({shown} of variables)"


def place_stages(
    model: keras.Model, options: PipelineOptions, devices: list[str], strategy: Any = None
) -> list[Stage]:
    """Cuts the built ``model`` and makes each stage's variables on its device (same values).

    ``strategy``: the hybrid's MultiWorkerMirroredStrategy, whose mirrored variables each stage's
    become (one component, on the stage's device); None for plain variables (one process).
    """
    names = split_names(model, options)
    stages = [Stage(m, d) for m, d in zip(cut(model, names), devices)]
    placed: set[int] = set()
    for stage in stages:
        # A variable of several stages (tied weights) lives on the first one's device.
        own = [v for v in stage.model.variables if id(v) not in placed]
        placed.update(id(v) for v in own)
        move_variables_to_device(own, stage.device, strategy)
    logger.info("Pipeline of %d stages: %s.", len(stages), "; ".join(map(_described, stages)))
    # Keras's own compiled functions, if any, traced the old variables.
    model.train_function = model.test_function = model.predict_function = None
    return stages
