"""The batch size of a dataset of global batches, read without using up one of its orders."""

from __future__ import annotations

import logging

import tensorflow as tf

from tfdist._compat.tf_internals.inputs import static_batch_size
from tfdist.config import invalid_argument

logger = logging.getLogger(__name__)


def read_batch_size(ds: tf.data.Dataset, argument: str) -> int:
    """The batch size of ``ds``, with a clear error when it has none.

    Read off the pipeline's graph when tf.data can (`static_batch_size`: no element is
    read, so a reshuffling dataset keeps its first order for the first epoch); else off the
    first element, which makes one iterator: it uses up one order of a dataset that reshuffles
    each iteration (pass ``global_batch_size`` to avoid it).
    """
    size = static_batch_size(ds) if int(ds.cardinality()) != 0 else None  # none: say so below
    if size is not None:
        return size
    logger.info(
        "`%s`: reading the batch size off the first batch (one iterator: a dataset that "
        "reshuffles each iteration then starts on its second order); pass global_batch_size "
        "to skip this.",
        argument,
    )
    for element in ds.take(1):
        first = tf.nest.flatten(element)[0]
        if first.shape.rank:
            return int(first.shape[0])
        raise invalid_argument(
            "global_batch_size",
            None,
            "a positive integer",
            note=f"`{argument}` yields unbatched elements (shape {first.shape}), so the batch "
            "size cannot be read off them; batch the dataset or pass global_batch_size.",
        )
    raise invalid_argument(
        "global_batch_size",
        None,
        "a positive integer",
        note=f"`{argument}` yields no batches, so the batch size cannot be read off it; "
        "pass global_batch_size (or non-empty data).",
    )
