"""Built-in datasets as dataset_fns that shard and batch per replica.

``load`` returns a :class:`DatasetFn`: call ``.bind(global_batch_size=...)``,
then hand it to ``strategy.distribute_datasets_from_function`` (or the
Trainer). Each call with an ``input_context`` builds that pipeline's shard:

* training: shuffled per-replica batches, ``drop_remainder=True``, exactly
  ``steps_per_epoch() * replicas_per_pipeline`` of them on every pipeline, so
  multi-worker collectives never wait for a pipeline that ran dry;
* evaluation: unshuffled ``(x, y)`` batches; the last may be partial, and a
  pipeline with a smaller shard is topped up with *empty* batches, so every
  pipeline yields the same number of batches while each real example is
  counted exactly once (the Trainer's step skips empty batches).

In-memory data ("digits", "synthetic") is read with ``from_tensor_slices``, not a
Python generator. The "GeneratorDatasetOp ... will not be optimized" line that
TF logs under MirroredStrategy with several devices comes from TF's own
multi-device iterator, whatever the input pipeline.

Nothing is downloaded at run time: "digits" ships with scikit-learn,
"synthetic" is generated, and "tfds:NAME" must already be prepared in
``data_dir``.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import math
from typing import Any, Protocol

import numpy as np
import tensorflow as tf

from tfdist.config import check_positive_int, invalid_argument
from tfdist.data import sharding

logger = logging.getLogger(__name__)

DATASET_NAMES = ("digits", "synthetic", "tfds:NAME")
DIGITS_SPLITS = ("train", "validation", "test", "all")  # "test" is an alias of "validation"
SYNTHETIC_SPLITS = ("train", "validation", "test")      # "test" is an alias of "validation"
_SYNTHETIC_SPLIT_SEEDS = {"train": 1, "validation": 2, "test": 2}
_SYNTHETIC_WEIGHT_SEED = 0  # one labelling function for every split, so validation is learnable
_TFDS_SHUFFLE_BUFFER_SIZE = 10_000


class _Source(Protocol):
    def examples(self, input_context: tf.distribute.InputContext, *, training: bool,
                 seed: int) -> tf.data.Dataset:
        """Returns this pipeline's shard as unbatched ``(x float32, y int32)`` examples."""


@dataclasses.dataclass(frozen=True, eq=False)
class _ArraySource:
    """In-memory examples, sharded by example index (DATA policy)."""

    x: np.ndarray
    y: np.ndarray

    def examples(self, input_context, *, training, seed):
        del training, seed  # Shuffling happens after sharding, in DatasetFn.
        p, i = input_context.num_input_pipelines, input_context.input_pipeline_id
        return tf.data.Dataset.from_tensor_slices((self.x[i::p], self.y[i::p]))


@dataclasses.dataclass(frozen=True, eq=False)
class _TfdsSource:
    """A prepared TFDS split: FILE sharding when training over enough files, else DATA."""

    builder: Any
    split: str
    num_files: int

    def examples(self, input_context, *, training, seed):
        import tensorflow_datasets as tfds

        p, i = input_context.num_input_pipelines, input_context.input_pipeline_id
        # Evaluation shards by example, so each shard is at most ceil(n / p) examples and
        # fits in the batches DatasetFn takes: topping up with empty batches and take()
        # never drop a real one.
        by_file = training and p > 1 and self.num_files >= p
        read_config = tfds.ReadConfig(input_context=input_context if by_file else None, shuffle_seed=seed)
        try:
            ds = self.builder.as_dataset(split=self.split, as_supervised=True, shuffle_files=by_file,
                                         read_config=read_config)
        except AssertionError as e:  # tfds asserts when the data files are missing
            raise _not_prepared(self.builder.name, self.builder.data_dir) from e
        if p > 1 and not by_file:
            ds = ds.shard(p, i)
        return ds.map(_decode_tfds, num_parallel_calls=tf.data.AUTOTUNE)


def _decode_tfds(image: tf.Tensor, label: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    if image.dtype == tf.uint8:
        image = tf.cast(image, tf.float32) / 255.0
    return tf.cast(image, tf.float32), tf.cast(label, tf.int32)


@dataclasses.dataclass(frozen=True)
class DatasetFn:
    """A dataset_fn(input_context) -> tf.data.Dataset of PER-REPLICA batches, plus the metadata the Trainer needs.

    Build one with :func:`load`, then :meth:`bind` it to a global batch size.

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
    source: _Source | None = dataclasses.field(default=None, repr=False, compare=False)

    def bind(self, *, global_batch_size: int, training: bool | None = None, seed: int | None = None) -> DatasetFn:
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
                "global_batch_size", global_batch_size,
                f"at most the {self.num_examples} examples of {self.name!r} split {self.split!r}",
                note="Training drops the last partial batch, so an epoch would have no steps.")
        return dataclasses.replace(self, global_batch_size=int(global_batch_size), training=training,
                                   seed=self.seed if seed is None else int(seed))

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
        ctx = input_context if input_context is not None else sharding.default_input_context()
        sharding.per_replica_batch_size(global_batch_size, ctx.num_replicas_in_sync)  # our error first
        per_replica = ctx.get_per_replica_batch_size(global_batch_size)
        batches_per_pipeline = None if self.num_examples is None else (
            self.steps_per_epoch() * sharding.replicas_per_pipeline(ctx))
        ds = self.source.examples(ctx, training=self.training, seed=self.seed)
        if self.training:
            ds = self._training_batches(ds, per_replica, batches_per_pipeline)
        else:
            ds = self._evaluation_batches(ds, per_replica, batches_per_pipeline)
        return ds.prefetch(tf.data.AUTOTUNE)

    def _training_batches(self, ds, per_replica, batches_per_pipeline):
        buffer_size = min(self.shuffle_buffer_size or math.inf, self.num_examples or _TFDS_SHUFFLE_BUFFER_SIZE)
        ds = ds.shuffle(buffer_size, seed=self.seed, reshuffle_each_iteration=True)
        if batches_per_pipeline is None:
            logger.warning("%s: num_examples is unknown, so pipelines may yield different batch counts.", self.name)
            return ds.batch(per_replica, drop_remainder=True)
        # repeat() first: uneven (file) shards still fill the same number of batches.
        return ds.repeat().batch(per_replica, drop_remainder=True).take(batches_per_pipeline)

    def _evaluation_batches(self, ds, per_replica, batches_per_pipeline):
        batches = ds.batch(per_replica)
        if batches_per_pipeline is None:
            logger.warning("%s: num_examples is unknown, so pipelines may yield different batch counts.", self.name)
            return batches
        # Top up with empty batches: every pipeline runs the same number of
        # steps, and each real example is still counted exactly once.
        x_spec, y_spec = ds.element_spec
        empty = tf.data.Dataset.from_tensors(
            (tf.zeros((0, *x_spec.shape), x_spec.dtype), tf.zeros((0, *y_spec.shape), y_spec.dtype))).repeat()
        return batches.concatenate(empty).take(batches_per_pipeline)

    def _require_bound(self) -> int:
        if self.global_batch_size is None:
            raise invalid_argument("global_batch_size", None, "a positive integer",
                                   note=f"The DatasetFn for {self.name!r} is unbound; "
                                        "call .bind(global_batch_size=...) first.")
        return self.global_batch_size


def load(name: str, *, split: str = "train", data_dir: str | None = None, seed: int = 0,
         training: bool | None = None, global_batch_size: int | None = None, **kwargs: Any) -> DatasetFn:
    """Returns a :class:`DatasetFn` for a built-in or prepared TFDS dataset.

    Args:
        name: ``"digits"`` (scikit-learn's 8x8 digits), ``"synthetic"``
            (seeded Gaussian inputs, linearly separable labels) or
            ``"tfds:NAME"`` (a TFDS dataset already prepared in ``data_dir``).
        split: digits: train, validation, test (= validation), all.
            synthetic: train, validation, test (= validation). tfds: any split
            of the builder; "validation" falls back to "test" if absent.
        data_dir: TFDS data directory (tfds only; None = TFDS default).
        seed: Shuffle seed.
        training: Mode; ``None`` means training iff ``split`` starts with "train".
        global_batch_size: If given, the result is already bound.
        **kwargs: synthetic: ``input_shape=(8, 8, 1)``, ``num_classes=10``,
            ``num_examples=1024``. tfds: ``shuffle_buffer_size=10000``.

    Raises:
        ValueError: Unknown dataset, split or keyword argument, or a TFDS dataset
            that is not prepared.
    """
    if not isinstance(name, str):
        raise invalid_argument("dataset", name, DATASET_NAMES)
    if not isinstance(split, str):
        raise invalid_argument("split", split, "a split name such as 'train' or 'validation'")
    if name == "digits":
        _check_kwargs(name, kwargs, ())
        fn = _load_digits(split)
    elif name == "synthetic":
        _check_kwargs(name, kwargs, ("input_shape", "num_classes", "num_examples"))
        fn = _load_synthetic(split, **kwargs)
    elif name.startswith("tfds:") and len(name) > len("tfds:"):
        _check_kwargs(name, kwargs, ("shuffle_buffer_size",))
        fn = _load_tfds(name, split, data_dir, **kwargs)
    else:
        raise invalid_argument("dataset", name, DATASET_NAMES)
    fn = dataclasses.replace(fn, seed=int(seed), training=split.startswith("train") if training is None else training)
    logger.info("Loaded %s split %r: %s examples of shape %s, %d classes.", name, fn.split, fn.num_examples,
                fn.input_shape, fn.num_classes)
    return fn if global_batch_size is None else fn.bind(global_batch_size=global_batch_size)


def _check_kwargs(name: str, kwargs: dict[str, Any], accepted: tuple[str, ...]) -> None:
    for key in sorted(set(kwargs) - set(accepted)):
        raise invalid_argument(key, kwargs[key], f"an option of dataset {name!r}: {', '.join(accepted) or 'it takes none'}")


@functools.lru_cache(maxsize=1)
def _digits_arrays() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32).reshape(-1, 8, 8, 1)
    y = digits.target.astype(np.int32)
    x_train, x_val, y_train, y_val = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    splits = {"train": (x_train, y_train), "validation": (x_val, y_val), "test": (x_val, y_val), "all": (x, y)}
    for arrays in splits.values():
        for a in arrays:
            a.setflags(write=False)  # cached and shared: keep it immutable
    return splits


def _load_digits(split: str) -> DatasetFn:
    if split not in DIGITS_SPLITS:
        raise invalid_argument("split", split, DIGITS_SPLITS)
    x, y = _digits_arrays()[split]
    return DatasetFn(name="digits", split=split, num_examples=len(y), input_shape=(8, 8, 1), num_classes=10,
                     source=_ArraySource(x, y))


def _load_synthetic(split: str, *, input_shape: tuple[int, ...] = (8, 8, 1), num_classes: int = 10,
                    num_examples: int = 1024) -> DatasetFn:
    if split not in SYNTHETIC_SPLITS:
        raise invalid_argument("split", split, SYNTHETIC_SPLITS)
    input_shape = tuple(input_shape)
    if not input_shape or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in input_shape):
        raise invalid_argument("input_shape", input_shape, "a non-empty tuple of positive ints, e.g. (8, 8, 1)")
    check_positive_int("num_classes", num_classes)
    check_positive_int("num_examples", num_examples)
    features = math.prod(input_shape)
    weights = np.random.default_rng(_SYNTHETIC_WEIGHT_SEED).standard_normal((features, num_classes))
    x = np.random.default_rng(_SYNTHETIC_SPLIT_SEEDS[split]).standard_normal((num_examples, features))
    y = np.argmax(x @ weights, axis=1).astype(np.int32)
    x = x.astype(np.float32).reshape((num_examples, *input_shape))
    return DatasetFn(name="synthetic", split=split, num_examples=num_examples, input_shape=input_shape,
                     num_classes=num_classes, source=_ArraySource(x, y))


def _not_prepared(name: str, data_dir: Any) -> ValueError:
    return invalid_argument(
        "data_dir", str(data_dir), f"a directory holding the prepared TFDS dataset {name!r}",
        note=("tfdist downloads nothing at run time. Prepare it beforehand where there is network access, "
              f"e.g. `tfds build {name} --data_dir=DIR`, then pass data_dir=DIR."))


def _load_tfds(name: str, split: str, data_dir: str | None, *,
               shuffle_buffer_size: int = _TFDS_SHUFFLE_BUFFER_SIZE) -> DatasetFn:
    import tensorflow_datasets as tfds

    tfds_name = name[len("tfds:"):]
    check_positive_int("shuffle_buffer_size", shuffle_buffer_size)
    try:
        builder = tfds.builder(tfds_name, data_dir=data_dir)
    except tfds.core.DatasetNotFoundError as e:
        raise invalid_argument("dataset", name, "tfds:NAME with NAME a TFDS dataset (see tfds.list_builders())",
                               note=str(e).splitlines()[0]) from e
    info = builder.info
    if not info.splits:  # metadata is written by download_and_prepare, which we never call
        raise _not_prepared(tfds_name, data_dir if data_dir is not None else builder.data_dir)
    if split == "validation" and "validation" not in info.splits and "test" in info.splits:
        logger.info("%s has no validation split; using 'test'.", name)
        split = "test"
    try:
        split_info = info.splits[split]
    except (KeyError, ValueError) as e:
        raise invalid_argument("split", split, sorted(info.splits.keys())) from e
    keys = info.supervised_keys
    if not (isinstance(keys, tuple) and len(keys) == 2 and all(isinstance(k, str) for k in keys)):
        raise invalid_argument("dataset", name, "a TFDS image classification dataset with (image, label) "
                               f"supervised keys", note=f"Its supervised_keys are {keys!r}.")
    image, label = info.features[keys[0]], info.features[keys[1]]
    input_shape = tuple(image.shape)
    num_classes = getattr(label, "num_classes", None)
    if not input_shape or None in input_shape or not num_classes:
        raise invalid_argument("dataset", name, "a TFDS dataset with fixed-shape images and a ClassLabel label",
                               note=f"Its features are {keys[0]}: shape {input_shape}, {keys[1]}: {label!r}.")
    return DatasetFn(name=name, split=split, num_examples=int(split_info.num_examples), input_shape=input_shape,
                     num_classes=int(num_classes), shuffle_buffer_size=shuffle_buffer_size,
                     source=_TfdsSource(builder, split, int(getattr(split_info, "num_shards", 1) or 1)))
