"""Prepared TensorFlow Datasets ("tfds:NAME"): read from ``data_dir``, never downloaded.

``tensorflow_datasets`` is imported only when a "tfds:" dataset is loaded.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import tensorflow as tf

from tfdist.config import TFDS_PREFIX, check_positive_int, invalid_argument
from tfdist.data.dataset_fn import DEFAULT_SHUFFLE_BUFFER_SIZE, DatasetFn

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, eq=False)
class TfdsSource:
    """A prepared TFDS split: FILE sharding when training over enough files, else DATA."""

    builder: Any
    split: str
    num_files: int

    def examples(
        self, input_context: tf.distribute.InputContext, *, training: bool, seed: int
    ) -> tf.data.Dataset:
        import tensorflow_datasets as tfds

        p, i = input_context.num_input_pipelines, input_context.input_pipeline_id
        # Evaluation shards by example, so each shard is at most ceil(n / p) examples and
        # fits in the batches DatasetFn takes: topping up with empty batches and take()
        # never drop a real one.
        by_file = training and p > 1 and self.num_files >= p
        read_config = tfds.ReadConfig(
            input_context=input_context if by_file else None, shuffle_seed=seed
        )
        try:
            ds = self.builder.as_dataset(
                split=self.split, as_supervised=True, shuffle_files=by_file, read_config=read_config
            )
        except AssertionError as e:  # tfds asserts when the data files are missing
            raise _not_prepared(self.builder.name, self.builder.data_dir) from e
        if p > 1 and not by_file:
            ds = ds.shard(p, i)
        return ds.map(_decode, num_parallel_calls=tf.data.AUTOTUNE)


def _decode(image: tf.Tensor, label: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    if image.dtype == tf.uint8:
        image = tf.cast(image, tf.float32) / 255.0
    return tf.cast(image, tf.float32), tf.cast(label, tf.int32)


def _not_prepared(name: str, data_dir: Any) -> ValueError:
    return invalid_argument(
        "data_dir",
        str(data_dir),
        f"a directory holding the prepared TFDS dataset {name!r}",
        note=(
            "tfdist downloads nothing at run time. Prepare it beforehand where there is network "
            f"access, e.g. `tfds build {name} --data_dir=DIR`, then pass data_dir=DIR."
        ),
    )


def load_tfds(
    name: str,
    split: str,
    data_dir: str | None,
    *,
    shuffle_buffer_size: int = DEFAULT_SHUFFLE_BUFFER_SIZE,
) -> DatasetFn:
    """A prepared TFDS image classification split; ``name`` is "tfds:NAME"."""
    import tensorflow_datasets as tfds

    tfds_name = name[len(TFDS_PREFIX) :]
    check_positive_int("shuffle_buffer_size", shuffle_buffer_size)
    try:
        builder = tfds.builder(tfds_name, data_dir=data_dir)
    except tfds.core.DatasetNotFoundError as e:
        raise invalid_argument(
            "dataset",
            name,
            "tfds:NAME with NAME a TFDS dataset (see tfds.list_builders())",
            note=str(e).splitlines()[0],
        ) from e
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
        raise invalid_argument(
            "dataset",
            name,
            "a TFDS image classification dataset with (image, label) supervised keys",
            note=f"Its supervised_keys are {keys!r}.",
        )
    image, label = info.features[keys[0]], info.features[keys[1]]
    input_shape = tuple(image.shape)
    num_classes = getattr(label, "num_classes", None)
    if not input_shape or None in input_shape or not num_classes:
        raise invalid_argument(
            "dataset",
            name,
            "a TFDS dataset with fixed-shape images and a ClassLabel label",
            note=f"Its features are {keys[0]}: shape {input_shape}, {keys[1]}: {label!r}.",
        )
    num_files = int(getattr(split_info, "num_shards", 1) or 1)
    return DatasetFn(
        name=name,
        split=split,
        num_examples=int(split_info.num_examples),
        input_shape=input_shape,
        num_classes=int(num_classes),
        shuffle_buffer_size=shuffle_buffer_size,
        source=TfdsSource(builder, split, num_files),
    )
