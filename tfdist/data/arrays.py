"""The in-memory datasets: scikit-learn's bundled "digits", seeded "synthetic" and "patterns".

All are read with ``from_tensor_slices``, not a Python generator. The
"GeneratorDatasetOp ... will not be optimized" line that TF logs under
MirroredStrategy with several devices comes from TF's own multi-device
iterator, whatever the input pipeline.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import numpy as np
import tensorflow as tf

from tfdist.config import check_positive_int, invalid_argument
from tfdist.data.dataset_fn import DatasetFn

DIGITS_SPLITS = ("train", "validation", "test", "all")  # "test" is an alias of "validation"
SYNTHETIC_SPLITS = ("train", "validation", "test")  # "test" is an alias of "validation"
_SYNTHETIC_SPLIT_SEEDS = {"train": 1, "validation": 2, "test": 2}
_SYNTHETIC_WEIGHT_SEED = 0  # one labelling function for every split, so validation is learnable
#: "patterns": each class's motif is added at this amplitude to unit Gaussian noise. At 1.2 the
#: ``convnet`` needs a couple of epochs of 4,096 32x32 images to tell 10 classes apart at 0.99.
PATTERN_SIGNAL = 1.2


@dataclasses.dataclass(frozen=True, eq=False)
class ArraySource:
    """In-memory examples: the whole split for training (``whole_split``), else by example index."""

    x: np.ndarray
    y: np.ndarray
    whole_split = True  # every pipeline holds the arrays anyway: shuffling all of them is cheap

    def examples(
        self, input_context: tf.distribute.InputContext, *, training: bool, seed: int
    ) -> tf.data.Dataset:
        del training, seed  # Shuffling happens in DatasetFn.
        p, i = input_context.num_input_pipelines, input_context.input_pipeline_id
        return tf.data.Dataset.from_tensor_slices((self.x[i::p], self.y[i::p]))


@functools.lru_cache(maxsize=1)
def _digits_arrays() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32).reshape(-1, 8, 8, 1)
    y = digits.target.astype(np.int32)
    x_train, x_val, y_train, y_val = train_test_split(
        x, y, test_size=0.2, random_state=0, stratify=y
    )
    splits = {
        "train": (x_train, y_train),
        "validation": (x_val, y_val),
        "test": (x_val, y_val),
        "all": (x, y),
    }
    for arrays in splits.values():
        for a in arrays:
            a.setflags(write=False)  # cached and shared: keep it immutable
    return splits


def load_digits(split: str) -> DatasetFn:
    """scikit-learn's 8x8 digits in [0, 1], a fixed stratified 80/20 train/validation split."""
    if split not in DIGITS_SPLITS:
        raise invalid_argument("split", split, DIGITS_SPLITS)
    x, y = _digits_arrays()[split]
    return DatasetFn(
        name="digits",
        split=split,
        num_examples=len(y),
        input_shape=(8, 8, 1),
        num_classes=10,
        source=ArraySource(x, y),
    )


def _checked_shape(input_shape: Any, num_classes: Any, num_examples: Any) -> tuple[int, ...]:
    """``input_shape`` as a tuple, with the generated datasets' other options checked."""
    input_shape = tuple(input_shape)
    if not input_shape or any(
        isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in input_shape
    ):
        raise invalid_argument(
            "input_shape", input_shape, "a non-empty tuple of positive ints, e.g. (8, 8, 1)"
        )
    check_positive_int("num_classes", num_classes)
    check_positive_int("num_examples", num_examples)
    return input_shape


def load_synthetic(
    split: str,
    *,
    input_shape: tuple[int, ...] = (8, 8, 1),
    num_classes: int = 10,
    num_examples: int = 1024,
) -> DatasetFn:
    """Seeded Gaussian inputs with linearly separable labels (one labelling for every split)."""
    if split not in SYNTHETIC_SPLITS:
        raise invalid_argument("split", split, SYNTHETIC_SPLITS)
    input_shape = _checked_shape(input_shape, num_classes, num_examples)
    features = math.prod(input_shape)
    weights = np.random.default_rng(_SYNTHETIC_WEIGHT_SEED).standard_normal((features, num_classes))
    rng = np.random.default_rng(_SYNTHETIC_SPLIT_SEEDS[split])
    x = rng.standard_normal((num_examples, features))
    y = np.argmax(x @ weights, axis=1).astype(np.int32)
    x = x.astype(np.float32).reshape((num_examples, *input_shape))
    return DatasetFn(
        name="synthetic",
        split=split,
        num_examples=num_examples,
        input_shape=input_shape,
        num_classes=num_classes,
        source=ArraySource(x, y),
    )


def pattern_motifs(input_shape: tuple[int, ...], num_classes: int) -> np.ndarray:
    """The "patterns" classes' motifs: ``(num_classes, m, m, channels)``, m a quarter of the side.

    One fixed draw (seed 0) of unit Gaussian values, the same for every split.
    """
    height, width, channels = input_shape
    m = max(1, min(height, width) // 4)
    rng = np.random.default_rng(_SYNTHETIC_WEIGHT_SEED)
    return rng.standard_normal((num_classes, m, m, channels))


def load_patterns(
    split: str,
    *,
    input_shape: tuple[int, ...] = (32, 32, 3),
    num_classes: int = 10,
    num_examples: int = 4096,
) -> DatasetFn:
    """Seeded images: unit Gaussian noise, and the motif of the image's class at a random place.

    Each class has one fixed motif (`pattern_motifs`, a quarter of the image's side), added at
    amplitude `PATTERN_SIGNAL` where a uniform random shift puts it. The class is in local
    structure, found anywhere in the image: matching each motif at every place names the class,
    and a convolutional network learns it in a few epochs (``tfdist.models.get("convnet")``),
    while the nearest class mean of the pixels (a linear rule) is near chance. Made in numpy
    from fixed seeds per split, nothing downloaded; the same arrays on every call.
    """
    if split not in SYNTHETIC_SPLITS:
        raise invalid_argument("split", split, SYNTHETIC_SPLITS)
    input_shape = _checked_shape(input_shape, num_classes, num_examples)
    if len(input_shape) != 3:
        raise invalid_argument(
            "input_shape", input_shape, "(height, width, channels) for dataset 'patterns'"
        )
    motifs = pattern_motifs(input_shape, num_classes)
    m = motifs.shape[1]
    rng = np.random.default_rng(_SYNTHETIC_SPLIT_SEEDS[split])
    y = rng.integers(num_classes, size=num_examples).astype(np.int32)
    x = rng.standard_normal((num_examples, *input_shape))
    rows = rng.integers(0, input_shape[0] - m + 1, size=num_examples)[:, None] + np.arange(m)
    cols = rng.integers(0, input_shape[1] - m + 1, size=num_examples)[:, None] + np.arange(m)
    index = np.arange(num_examples)[:, None, None]
    x[index, rows[:, :, None], cols[:, None, :]] += PATTERN_SIGNAL * motifs[y]
    return DatasetFn(
        name="patterns",
        split=split,
        num_examples=num_examples,
        input_shape=input_shape,
        num_classes=num_classes,
        source=ArraySource(x.astype(np.float32), y),
    )
