"""The built-in datasets by name, and ``load``: the one entry point to them.

``load`` returns a `DatasetFn`: call
``.bind(global_batch_size=...)``, then hand it to
``strategy.distribute_datasets_from_function`` (or the Trainer).

Where each job lives:

* ``tfdist.data.dataset_fn``: ``DatasetFn``, the sharding and batching every
  dataset shares (training and evaluation batches, the batch counts);
* ``tfdist.data.arrays``: the in-memory datasets, "digits", "synthetic" and "patterns";
* ``tfdist.data.text``: "python_source", the interpreter's standard library as byte tokens;
* ``tfdist.data.tfds_source``: prepared TFDS datasets, "tfds:NAME";
* here: the names, and checking each dataset's keyword options.

Nothing is downloaded at run time: "digits" ships with scikit-learn,
"synthetic" and "patterns" are generated, "python_source" is read from the running
interpreter's own files, and "tfds:NAME" must already be prepared in
``data_dir``.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from tfdist.config import DATASET_NAMES, invalid_argument, is_tfds_name
from tfdist.data import arrays, text, tfds_source
from tfdist.data.arrays import DIGITS_SPLITS, SYNTHETIC_SPLITS
from tfdist.data.dataset_fn import DatasetFn

logger = logging.getLogger(__name__)

__all__ = ["DATASET_NAMES", "DIGITS_SPLITS", "SYNTHETIC_SPLITS", "DatasetFn", "load"]


def load(
    name: str,
    *,
    split: str = "train",
    data_dir: str | None = None,
    seed: int = 0,
    training: bool | None = None,
    global_batch_size: int | None = None,
    **kwargs: Any,
) -> DatasetFn:
    """Returns a `DatasetFn` for a built-in or prepared TFDS dataset.

    Args:
        name: ``"digits"`` (scikit-learn's 8x8 digits), ``"synthetic"``
            (seeded Gaussian inputs, linearly separable labels), ``"patterns"`` (seeded
            32x32x3 noise images holding their class's motif at a random place),
            ``"python_source"`` (the running interpreter's standard library as bytes, each
            example ``seq_len`` int32 tokens and their next bytes as targets, 256 classes) or
            ``"tfds:NAME"`` (a TFDS dataset already prepared in ``data_dir``).
        split: digits: train, validation, test (= validation), all.
            synthetic, patterns, python_source: train, validation, test (= validation).
            tfds: any split of the builder; "validation" falls back to "test" if absent.
        data_dir: TFDS data directory (tfds only; None = TFDS default).
        seed: Shuffle seed.
        training: Mode; ``None`` means training iff ``split`` starts with "train".
        global_batch_size: If given, the result is already bound.
        **kwargs: synthetic: ``input_shape=(8, 8, 1)``, ``num_classes=10``,
            ``num_examples=1024``. patterns: ``input_shape=(32, 32, 3)``,
            ``num_classes=10``, ``num_examples=4096``. python_source: ``seq_len=128``,
            ``max_bytes`` (bytes of the split's text; None = all; not given: 2 MiB of train,
            256 KiB of validation). tfds: ``shuffle_buffer_size=10000``.

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
        fn = arrays.load_digits(split)
    elif name == "synthetic":
        _check_kwargs(name, kwargs, ("input_shape", "num_classes", "num_examples"))
        fn = arrays.load_synthetic(split, **kwargs)
    elif name == "patterns":
        _check_kwargs(name, kwargs, ("input_shape", "num_classes", "num_examples"))
        fn = arrays.load_patterns(split, **kwargs)
    elif name == "python_source":
        _check_kwargs(name, kwargs, ("seq_len", "max_bytes"))
        fn = text.load_python_source(split, **kwargs)
    elif is_tfds_name(name):
        _check_kwargs(name, kwargs, ("shuffle_buffer_size",))
        fn = tfds_source.load_tfds(name, split, data_dir, **kwargs)
    else:
        raise invalid_argument("dataset", name, DATASET_NAMES)
    training = split.startswith("train") if training is None else training
    fn = dataclasses.replace(fn, seed=int(seed), training=training)
    logger.info(
        "Loaded %s split %r: %s examples of shape %s, %d classes.",
        name,
        fn.split,
        fn.num_examples,
        fn.input_shape,
        fn.num_classes,
    )
    return fn if global_batch_size is None else fn.bind(global_batch_size=global_batch_size)


def _check_kwargs(name: str, kwargs: dict[str, Any], accepted: tuple[str, ...]) -> None:
    for key in sorted(set(kwargs) - set(accepted)):
        options = ", ".join(accepted) or "it takes none"
        raise invalid_argument(key, kwargs[key], f"an option of dataset {name!r}: {options}")
