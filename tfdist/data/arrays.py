"""The in-memory datasets: scikit-learn's bundled "digits" and seeded "synthetic" data.

Both are read with ``from_tensor_slices``, not a Python generator. The
"GeneratorDatasetOp ... will not be optimized" line that TF logs under
MirroredStrategy with several devices comes from TF's own multi-device
iterator, whatever the input pipeline.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import tensorflow as tf

from tfdist.config import check_positive_int, invalid_argument
from tfdist.data.dataset_fn import DatasetFn

DIGITS_SPLITS = ("train", "validation", "test", "all")  # "test" is an alias of "validation"
SYNTHETIC_SPLITS = ("train", "validation", "test")  # "test" is an alias of "validation"
_SYNTHETIC_SPLIT_SEEDS = {"train": 1, "validation": 2, "test": 2}
_SYNTHETIC_WEIGHT_SEED = 0  # one labelling function for every split, so validation is learnable


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
    input_shape = tuple(input_shape)
    if not input_shape or any(
        isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in input_shape
    ):
        raise invalid_argument(
            "input_shape", input_shape, "a non-empty tuple of positive ints, e.g. (8, 8, 1)"
        )
    check_positive_int("num_classes", num_classes)
    check_positive_int("num_examples", num_examples)
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
