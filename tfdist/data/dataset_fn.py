"""``DatasetFn``: a dataset_fn(input_context) of per-replica batches, bound to a global batch size.

Each call with an ``input_context`` builds that pipeline's shard from its
`Source`:

* training: shuffled per-replica batches, ``drop_remainder=True``, exactly
  ``steps_per_epoch() * replicas_per_pipeline`` of them on every pipeline, so
  multi-worker collectives never wait for a pipeline that ran dry. A source
  that holds the whole split in memory (``Source.whole_split``) is shuffled
  whole on every pipeline with the same seed, and each pipeline takes its part
  of every global batch: the global batches are then the same on any number of
  workers and replicas, so a backup resumes on another world size at the same
  data (see docs/launch.md, "Resuming on another world size"). Other sources (TFDS
  files) are shuffled per pipeline shard, as large data must be;
* evaluation: unshuffled ``(x, y)`` batches; the last may be partial, and a
  pipeline with a smaller shard is topped up with *empty* batches, so every
  pipeline yields the same number of batches while each real example is
  counted exactly once (the Trainer's step skips empty batches).

Where the examples come from is the source's job: in-memory arrays
(``tfdist.data.arrays``) or a prepared TFDS split (``tfdist.data.tfds_source``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Protocol

import tensorflow as tf

from tfdist.config import check_positive_int, invalid_argument
from tfdist.data import batch_sizes

logger = logging.getLogger(__name__)

# Shuffle buffer when a source cannot say how many examples it has (and TFDS's default).
DEFAULT_SHUFFLE_BUFFER_SIZE = 10_000


class Source(Protocol):
    """Where a `DatasetFn`'s examples come from.

    A source may set ``whole_split = True`` when ``examples`` can cheaply give
    every pipeline the whole split (in-memory arrays): training then shuffles
    the whole split and splits each global batch (see the module docstring).
    """

    def examples(
        self, input_context: tf.distribute.InputContext, *, training: bool, seed: int
    ) -> tf.data.Dataset:
        """Returns this pipeline's shard as unbatched ``(x float32, y int32)`` examples."""


@dataclasses.dataclass(frozen=True)
class DatasetFn:
    """A dataset_fn(input_context) -> tf.data.Dataset of PER-REPLICA batches, plus metadata.

    Build one with `tfdist.data.load`, then `bind` it to a global batch size.

    Attributes:
        name: The dataset name given to ``load``, e.g. ``"digits"``.
        split: The split actually read, e.g. ``"train"``.
        num_examples: Examples in this split, ``None`` if unknown.
        input_shape: Per-example feature shape, e.g. ``(8, 8, 1)``.
        num_classes: Number of label classes.
        global_batch_size: Examples per global step; ``None`` until bound.
        training: Shuffled, drop-remainder batches if True; unshuffled
            ``(x, y)`` batches that count every example exactly once if False
            (the last may be partial, then empty batches top up the pipeline).
        seed: Shuffle seed (shuffling is reseeded every iteration).
        shuffle_buffer_size: Elements in the shuffle buffer; ``None`` for the
            whole shard.
        source: Internal: where the examples come from.
    """

    name: str
    split: str
    num_examples: int | None
    input_shape: tuple[int, ...]
    num_classes: int
    global_batch_size: int | None = None
    training: bool = True
    seed: int = 0
    shuffle_buffer_size: int | None = None
    source: Source | None = dataclasses.field(default=None, repr=False, compare=False)

    def bind(
        self, *, global_batch_size: int, training: bool | None = None, seed: int | None = None
    ) -> DatasetFn:
        """Returns a copy bound to ``global_batch_size`` (and optionally a mode and seed).

        Args:
            global_batch_size: Examples per global step, over all replicas.
            training: Overrides the mode; ``None`` keeps the current one.
            seed: Overrides the shuffle seed; ``None`` keeps the current one.

        Raises:
            ValueError: If ``global_batch_size`` is not a positive int, or when
                training it exceeds ``num_examples`` (an epoch would be empty).
        """
        check_positive_int("global_batch_size", global_batch_size)
        training = self.training if training is None else bool(training)
        if training and self.num_examples is not None and global_batch_size > self.num_examples:
            raise invalid_argument(
                "global_batch_size",
                global_batch_size,
                f"at most the {self.num_examples} examples of {self.name!r} split {self.split!r}",
                note="Training drops the last partial batch, so an epoch would have no steps.",
            )
        return dataclasses.replace(
            self,
            global_batch_size=int(global_batch_size),
            training=training,
            seed=self.seed if seed is None else int(seed),
        )

    def steps_per_epoch(self) -> int | None:
        """Returns global steps in one pass, or ``None`` if ``num_examples`` is unknown.

        Training: ``num_examples // global_batch_size``. Evaluation:
        ``ceil(num_examples / global_batch_size)``.
        """
        global_batch_size = self._require_bound()
        if self.num_examples is None:
            return None
        if self.training:
            return self.num_examples // global_batch_size
        return math.ceil(self.num_examples / global_batch_size)

    def __call__(self, input_context: tf.distribute.InputContext | None = None) -> tf.data.Dataset:
        """Builds one input pipeline's dataset of per-replica batches.

        Runs outside replica context, once per input pipeline (worker).

        Args:
            input_context: From ``distribute_datasets_from_function``; ``None``
                means one pipeline feeding one replica (batches are global).

        Returns:
            ``(x, y)`` batches; ``x`` float32 ``(per_replica, *input_shape)``,
            ``y`` int32 ``(per_replica,)``. Evaluation batches may be partial
            or empty (see the module docstring).

        Raises:
            ValueError: If unbound, or the global batch size does not divide
                across the replicas in sync.
        """
        global_batch_size = self._require_bound()
        ctx = input_context if input_context is not None else batch_sizes.default_input_context()
        # Our error first, before TF's.
        batch_sizes.per_replica_batch_size(
            global_batch_size, ctx.num_replicas_in_sync, training=self.training
        )
        per_replica = ctx.get_per_replica_batch_size(global_batch_size)
        batches_per_pipeline = (
            None
            if self.num_examples is None
            else (self.steps_per_epoch() * batch_sizes.replicas_per_pipeline(ctx))
        )
        if self.training and self.num_examples and getattr(self.source, "whole_split", False):
            return self._global_batches(ctx, per_replica).prefetch(tf.data.AUTOTUNE)
        ds = self.source.examples(ctx, training=self.training, seed=self.seed)
        if self.training:
            ds = self._training_batches(ds, per_replica, batches_per_pipeline)
        else:
            ds = self._evaluation_batches(ds, per_replica, batches_per_pipeline)
        return ds.prefetch(tf.data.AUTOTUNE)

    def _training_batches(self, ds, per_replica, batches_per_pipeline):
        buffer_size = min(
            self.shuffle_buffer_size or math.inf, self.num_examples or DEFAULT_SHUFFLE_BUFFER_SIZE
        )
        ds = ds.shuffle(buffer_size, seed=self.seed, reshuffle_each_iteration=True)
        if batches_per_pipeline is None:
            logger.warning(
                "%s: num_examples is unknown, so pipelines may yield different batch counts.",
                self.name,
            )
            return ds.batch(per_replica, drop_remainder=True)
        # repeat() first: uneven (file) shards still fill the same number of batches.
        return ds.repeat().batch(per_replica, drop_remainder=True).take(batches_per_pipeline)

    def _global_batches(self, ctx, per_replica):
        """This pipeline's part of each global batch of the whole split, shuffled with the seed.

        Every pipeline shuffles the same split with the same seed, so global batch
        ``j`` is the same examples whatever the number of pipelines and replicas;
        pipeline ``i`` takes its ``global_batch_size / num_input_pipelines`` of them.
        """
        whole = batch_sizes.default_input_context()
        ds = self.source.examples(whole, training=True, seed=self.seed)
        buffer_size = min(self.shuffle_buffer_size or math.inf, self.num_examples)
        ds = ds.shuffle(buffer_size, seed=self.seed, reshuffle_each_iteration=True)
        part = per_replica * batch_sizes.replicas_per_pipeline(ctx)
        ds = ds.take(self.steps_per_epoch() * self.global_batch_size).batch(part)
        if ctx.num_input_pipelines > 1:
            ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
        return ds.rebatch(per_replica) if part != per_replica else ds

    def _evaluation_batches(self, ds, per_replica, batches_per_pipeline):
        batches = ds.batch(per_replica)
        if batches_per_pipeline is None:
            logger.warning(
                "%s: num_examples is unknown, so pipelines may yield different batch counts.",
                self.name,
            )
            return batches
        # Top up with empty batches: every pipeline runs the same number of
        # steps, and each real example is still counted exactly once.
        x_spec, y_spec = ds.element_spec
        empty = tf.data.Dataset.from_tensors(
            (tf.zeros((0, *x_spec.shape), x_spec.dtype), tf.zeros((0, *y_spec.shape), y_spec.dtype))
        )
        return batches.concatenate(empty.repeat()).take(batches_per_pipeline)

    def _require_bound(self) -> int:
        if self.global_batch_size is None:
            raise invalid_argument(
                "global_batch_size",
                None,
                "a positive integer",
                note=f"The DatasetFn for {self.name!r} is unbound; "
                "call .bind(global_batch_size=...) first.",
            )
        return self.global_batch_size
