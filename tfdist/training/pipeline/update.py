"""The pipeline's replica step: the GPipe schedule over stages (`tfdist.training.pipeline.options`).

`PipelineUpdate` is `tfdist.training.step.update.TrainUpdate` whose `micro_step` runs one global
batch as ``M`` micro-batches through the stages: every micro-batch forward, stage by stage
under each stage's device, Keras's loss on the last stage; then, micro-batch by micro-batch, each
stage's backward under its own device, ``tape.gradient(h, variables, output_gradients=dh)``.
All of it is in the one ``tf.function`` of the train step, so TF's dataflow executor runs the
stages of different micro-batches at once. Each micro-batch's loss is normalised by the
update's global batch, so the summed gradients are those of Keras's mean over the global batch;
the rest (exchange, update, logs, accumulation) is `TrainUpdate`'s.

Weight regularisers are differentiated on the last stage (their gradients join each
variable's own). Masked loss terms (Keras masks reaching the loss, ``ignore_class``) are taken
apart as `TrainUpdate` takes them (`tfdist.training.step.masked_losses`): each term's ``c_j * S_j``
has a
backward pass of its own through the stages, and the update weighs it by the term's valid count
over the whole update (all micro-batches, all replicas), as one device on the whole batch.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from tfdist._compat.keras_internals.masks import keras_mask, with_keras_mask
from tfdist._compat.keras_internals.optimizer import updates_on_variable_devices
from tfdist._compat.tf_internals.runtime import is_default_strategy
from tfdist.training.pipeline.checks import check_global_batch
from tfdist.training.pipeline.options import PipelineOptions, Stage, place_stages
from tfdist.training.pipeline.schedule import Schedule, stage_forward
from tfdist.training.step.exchange import all_reduce_sum
from tfdist.training.step.gradients import add_gradients
from tfdist.training.step.masked_losses import MaskedUpdate, output_sums, stack_term_rows
from tfdist.training.step.update import TrainUpdate

#: ``bucket_bytes`` that make every gradient one bucket (`tfdist.training.step.exchange.buckets`).
ONE_BUCKET = 2**62


def split_batch(data: Any, parts: int) -> list[Any]:
    """``data`` cut along its first axis into ``parts`` pieces (the first ones one larger when
    ``parts`` does not divide the batch: a partial last batch)."""
    if parts == 1:
        return [data]
    n = tf.shape(next(t for t in tf.nest.flatten(data) if t is not None))[0]
    sizes = n // parts + tf.cast(tf.range(parts) < n % parts, n.dtype)

    def pieces(t: Any) -> Any:
        return [None] * parts if t is None else tf.split(t, sizes, num=parts)

    flat = [pieces(t) for t in tf.nest.flatten(data)]
    return [tf.nest.pack_sequence_as(data, [f[i] for f in flat]) for i in range(parts)]


def pipeline_forward(stages: Sequence[Stage], micro_batches: int, x: Any, training: bool) -> Any:
    """The model's outputs on ``x`` through the stages, ``micro_batches`` at a time (inference)."""
    outputs = []
    for piece in split_batch(x, micro_batches):
        for k, stage in enumerate(stages):
            with tf.device(stage.device):
                piece = stage_forward(stage.model, piece, k, training=training)
            if k < len(stages) - 1:  # what crosses the cut, as a list
                piece = tf.nest.flatten(piece)
        outputs.append(piece)
    if len(outputs) == 1:
        return outputs[0]
    return tf.nest.map_structure(_concat, *outputs)


def _concat(*pieces: tf.Tensor) -> tf.Tensor:
    """The pieces of one output in one tensor, with their Keras masks (if any) likewise."""
    whole = tf.concat(pieces, axis=0)
    masks = [keras_mask(p) for p in pieces]
    if any(m is None for m in masks):
        return whole
    return with_keras_mask(whole, tf.concat(masks, axis=0))


class PipelineUpdate(TrainUpdate):
    """`TrainUpdate` whose micro-step is the GPipe schedule over ``stages`` (replica context).

    Args:
        stages: The model's stages, each on its device.
        micro_batches: ``M``, pieces of each global batch.
        **kwargs: `TrainUpdate`'s arguments.
    """

    def __init__(
        self,
        *args: Any,
        stages: Sequence[Stage],
        micro_batches: int,
        schedule: str = "gpipe",
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.stages = list(stages)
        self.micro_batches = micro_batches
        self.schedule = schedule
        self.index = {id(v): i for i, v in enumerate(self.model.trainable_variables)}

    def exchange(self, summed: Sequence[Any], count: tf.Tensor) -> tuple[list[Any], tf.Tensor]:
        """`TrainUpdate.exchange`; none for one replica (an all-reduce would copy every stage's
        gradients to one device); over the hybrid's workers, the stages' gradients (on several
        devices, which the strategy would reduce one collective each) go in one float32 buffer
        and one all-reduce unless buckets or compression are asked for."""
        if self.num_replicas == 1:  # nothing to exchange: each gradient stays on its device
            return list(summed), count
        if self.bucket_bytes is None and not self.gradient_compression:
            return all_reduce_sum(
                summed, count, num_replicas=self.num_replicas, bucket_bytes=ONE_BUCKET
            )
        return super().exchange(summed, count)

    def update(self, grads: Sequence[Any]) -> None:
        """`TrainUpdate.update`, each variable's update on its stage's device (the default
        strategy places none; the hybrid's strategy does it already)."""
        with updates_on_variable_devices(self.optimizer):
            super().update(grads)

    def micro_step(self, data: Any) -> tuple[list[Any], tf.Tensor, list[tf.Tensor], tf.Tensor]:
        """One global batch as ``M`` micro-batches through the stages, in the schedule's order
        (`tfdist.training.pipeline.schedule`); `TrainUpdate`'s contract (masked terms' sums,
        counts and gradients packed as `MaskedUpdate` packs them)."""
        pieces = split_batch(data, self.micro_batches)
        schedule = Schedule(self, pieces, self.schedule)
        batches = schedule.build()
        grads, variables = schedule.grads, self.model.trainable_variables
        term_grads = [[None] * len(variables) for _ in batches[0].loss.targets[1:]]
        for batch in batches:
            term_grads = [
                [_plus(a, b) for a, b in zip(t, m)] for t, m in zip(term_grads, batch.term_grads)
            ]
        if not self.present:
            self._learn(batches[0].loss.replica, grads, term_grads)
        if term_grads:  # a sparse variable's terms ride in its rows, as `TrainUpdate`'s do
            rows = [
                i
                for i in self.present
                if any(isinstance(g[i], tf.IndexedSlices) for g in [grads, *term_grads])
            ]
            stack_term_rows(grads, term_grads, self.present)
            for batch in batches:
                for t in batch.term_grads:
                    for i in rows:
                        t[i] = None
        self.fill_in(grads)
        extra = tf.zeros([0])
        for batch in batches:
            present = [[g[i] for i in self.present] for g in batch.term_grads]
            extra = MaskedUpdate.add(
                extra, self.masked.pack(batch.loss.parts, batch.loss.rest_log, present)
            )
        size = tf.add_n([b.size for b in batches])
        sums = [output_sums(self.model, b.loss.replica, b.size) for b in batches]
        return grads, size, [tf.add_n(list(s)) for s in zip(*sums)], extra


def _plus(a: Any, b: Any) -> Any:
    if a is None or b is None:
        return b if a is None else a
    return add_gradients(a, b)


class Pipeline:
    """A model's pipeline for `tfdist.training.functions.StepFunctions`: its options, devices
    and, once the model is built, its stages.

    Args:
        options: As given to the Trainer.
        devices: One per stage (`tfdist.training.pipeline.options.resolve_devices`).
        strategy: The Trainer's strategy: the default one, or the hybrid's
            MultiWorkerMirroredStrategy (one replica per worker).
    """

    def __init__(self, options: PipelineOptions, devices: list[str], strategy: Any) -> None:
        self.options = options
        self.devices = devices
        self.strategy = strategy
        self.stages: list[Stage] | None = None

    def place(self, model: keras.Model) -> None:
        """Cuts the built ``model`` and places its stages, once."""
        if self.stages is None:
            # check_pipeline_options let no other strategy through than the hybrid's.
            hybrid = None if is_default_strategy(self.strategy) else self.strategy
            self.stages = place_stages(model, self.options, self.devices, hybrid)
            # The variables' old storage, the whole model's, on this process's device: Keras's
            # symbolic build traced the model in a scratch graph, a reference cycle holding the
            # old handles, which only Python's collector frees. Free it before the optimizer's
            # slots are made (16.8M parameters cut in 2: the chief's peak 162-178 -> 148 MiB;
            # the capped-stages test's 8.4M: 126 -> 93.5 MiB).
            gc.collect()

    def optimizer_builder(self, model: keras.Model) -> Any:
        """Builds the optimizer after the stages are placed (its slots follow their variables)."""

        def build(variables: Any) -> None:
            self.place(model)
            model.optimizer.build(variables)

        return build

    def check_batch(self, global_batch_size: int) -> None:
        check_global_batch(global_batch_size, self.options, self.strategy.num_replicas_in_sync)

    def update_arguments(self) -> dict[str, Any]:
        """`PipelineUpdate`'s own arguments (`tfdist.training.updates` chooses the update)."""
        assert self.stages is not None, "the model is built before its step"
        return {
            "stages": self.stages,
            "micro_batches": self.options.micro_batches,
            "schedule": self.options.schedule,
        }

    def forward_fn(self) -> Any:
        """Inference's forward pass ``fn(x, training)`` through the stages."""
        stages, m = self.stages, self.options.micro_batches
        return lambda x, training: pipeline_forward(stages, m, x, training)
