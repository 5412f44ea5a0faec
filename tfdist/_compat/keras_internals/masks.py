"""Keras masks: the ``_keras_mask`` a tensor carries, and the masked terms of Keras's losses.

A Keras mask (``Embedding(mask_zero=True)``, ``Masking``, a recurrent layer with
``return_sequences=True``) rides on the output tensor as ``_keras_mask``; Keras's
``Loss.__call__`` reads it there, and its ``ignore_class`` sets one on the loss values.
A masked term with the ``"sum_over_batch_size"`` (or ``"mean"``) reduction is the
sum of its weighted values over its **local** valid count (and over the replica
count, under a strategy); a ``"mean_with_sample_weight"`` term, over its local sum of
sample weights. `masked_terms` records each such term and that count,
so the replica step can weigh it by the count of all replicas and micro-batches.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf

#: Keras's reductions that divide a masked term by its valid count.
_MEAN_REDUCTIONS = ("sum_over_batch_size", "mean")


def keras_mask(tensor: Any) -> Any:
    """The Keras mask ``tensor`` carries, or None."""
    # Private: Keras keeps a layer's output mask only as this tensor attribute.
    from keras.src.backend.common.masking import get_keras_mask

    return get_keras_mask(tensor)


def with_keras_mask(tensor: Any, mask: Any) -> Any:
    """``tensor`` carrying ``mask`` as its Keras mask (in place; None leaves it unmasked)."""
    # Private: Keras's losses and metrics read an output's mask only from this attribute.
    from keras.src.backend.common.masking import set_keras_mask

    if mask is not None:
        set_keras_mask(tensor, mask)
    return tensor


@dataclasses.dataclass
class Recording:
    """What `masked_terms` saw: the masked mean terms, and how many terms in all."""

    terms: list[MaskedTerm] = dataclasses.field(default_factory=list)
    calls: int = 0


@dataclasses.dataclass
class MaskedTerm:
    """One masked loss term as Keras computed it on one replica.

    ``value`` is Keras's value (``sum / (count * replicas)``); ``count`` is the number
    it divided the weighted sum by, so ``value * replicas * count`` is the sum.
    """

    value: tf.Tensor
    count: tf.Tensor


def _count(values: Any, sample_weight: Any, mask: Any, reduction: Any) -> tf.Tensor | None:
    """The count Keras divides a term's weighted sum by, where it is not the values' size.

    ``"sum_over_batch_size"``/``"mean"`` with a mask: the valid entries
    (``loss.apply_mask``); ``"mean_with_sample_weight"``: the sum of the weights, the
    mask merged in. None for a term whose divisor is its size (or that is not a mean).
    """
    if mask is not None and reduction in _MEAN_REDUCTIONS:
        mask = tf.cast(tf.convert_to_tensor(mask), tf.float32)
        values_size = tf.cast(tf.size(values), tf.float32)
        mask_size = tf.cast(tf.size(mask), tf.float32)
        # Keras weighs valid entries by total/valid, then divides the sum by the values' size.
        return tf.reduce_sum(mask) * tf.math.divide_no_nan(values_size, mask_size)
    if reduction == "mean_with_sample_weight" and (sample_weight is not None or mask is not None):
        # Private: Keras merges the mask into the weights here, as its reduction then sums them.
        from keras.src.losses.loss import apply_mask

        weights = apply_mask(sample_weight, mask, dtype="float32", reduction=reduction)
        return tf.reduce_sum(tf.cast(weights, tf.float32))
    return None


_ACTIVE = threading.local()  # this thread's recorders (MirroredStrategy runs replicas in threads)
_ORIGINAL: list[Any] = []  # Keras's own reduce_weighted_values, once it is wrapped


def _install() -> None:
    """Wraps Keras's loss reduction once; the wrapper is Keras's own outside `masked_terms`.

    Installed for good, not per block: replica threads enter and leave their blocks
    interleaved (a thread pauses at each merge_call), so a per-block patch would undo
    another thread's.
    """
    # Private: Keras's Loss.__call__ reduces through this module function, with the merged
    # mask (the output's and the loss's own, e.g. ignore_class) as an argument.
    from keras.src.losses import loss as loss_module

    if _ORIGINAL:
        return
    original = loss_module.reduce_weighted_values
    _ORIGINAL.append(original)

    def reduce_weighted_values(
        values, sample_weight=None, mask=None, reduction="sum_over_batch_size", dtype=None
    ):
        value = original(values, sample_weight, mask, reduction, dtype)
        stack = getattr(_ACTIVE, "stack", None)
        if not stack:
            return value
        recording, rescale = stack[-1]
        recording.calls += 1
        count = _count(values, sample_weight, mask, reduction)
        if count is None:
            return value
        term = MaskedTerm(value, tf.stop_gradient(count))
        if rescale is not None:
            term.value = rescale(value, term.count)
        recording.terms.append(term)
        return term.value

    loss_module.reduce_weighted_values = reduce_weighted_values


@contextlib.contextmanager
def masked_terms(
    rescale: Callable[[tf.Tensor, tf.Tensor], tf.Tensor] | None = None,
) -> Iterator[Recording]:
    """Within this block (on this thread), every masked mean term of a Keras ``Loss`` is recorded.

    A masked mean: a masked ``"sum_over_batch_size"`` (or ``"mean"``) term, or a
    ``"mean_with_sample_weight"`` term with sample weights or a mask.
    ``rescale(value, count)``, when given, replaces each one's value (e.g. to
    divide its sum by a global count). Other terms are neither recorded nor changed.
    """
    _install()
    recording = Recording()
    stack = _ACTIVE.__dict__.setdefault("stack", [])
    stack.append((recording, rescale))
    try:
        yield recording
    finally:
        stack.pop()


def keras_reduces_masked_terms_by_local_count() -> bool:
    """Whether Keras's masked ``sum_over_batch_size`` is the sum over the valid count.

    The behaviour `masked_terms` relies on (its test fails when Keras changes it).
    """
    import keras

    y_true = tf.constant([[[1.0], [2.0], [3.0], [4.0]]])
    y_pred = with_keras_mask(tf.zeros((1, 4, 1)), tf.constant([[True, False, True, False]]))
    with masked_terms() as recording:
        value = keras.losses.MeanSquaredError()(y_true, y_pred)
    return (
        recording.calls == 1
        and len(recording.terms) == 1
        and abs(float(value) - (1.0 + 9.0) / 2.0) < 1e-6
        and float(recording.terms[0].count) == 2.0
    )
