"""A trackable that a checkpoint saves as one whole tensor, under a plain variable's key.

`WholeTensor` turns TF's private checkpoint hooks into two public ones that a subclass gives:
``whole()`` (the tensor to save) and ``assign_whole(value)`` (restore from it). What the tensor
is, and how it is cut up in between, is the subclass's: ZeRO's sharded slots
(`tfdist.training.zero.checkpoint.ConsolidatedShard`) gather their replicas' blocks into it,
so a sharded run's checkpoint has an unsharded run's format. For TF's asynchronous checkpoints
it copies itself to the host (`_HostCopy`).

Private TF API: ``Trackable._serialize_to_tensors``, ``_restore_from_tensors``
and ``_copy_trackable_to_cpu`` (TF 2.21).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from tensorflow.python.trackable import base as trackable

_KEY = trackable.VARIABLE_VALUE_KEY


class WholeTensor(trackable.Trackable):
    """What a checkpoint tracks in place of a variable: one tensor, saved and restored whole.

    Subclasses implement `whole` and `assign_whole`.
    """

    def whole(self) -> tf.Tensor:
        """The tensor to save (may run a collective)."""
        raise NotImplementedError

    def assign_whole(self, value: Any) -> Any:
        """Restores from ``value``, a tensor as `whole` returns it."""
        raise NotImplementedError

    def _serialize_to_tensors(self) -> dict[str, tf.Tensor]:
        return {_KEY: self.whole()}

    def _restore_from_tensors(self, restored_tensors: dict[str, tf.Tensor]) -> Any:
        return self.assign_whole(restored_tensors[_KEY])

    def _copy_trackable_to_cpu(self, object_map: dict) -> None:
        """For asynchronous checkpoints: a host variable holding the whole tensor."""
        if self not in object_map:
            with tf.init_scope(), tf.device("/cpu:0"):
                object_map[self] = _HostCopy(tf.Variable(self.whole(), trainable=False))
        else:
            object_map[self].variable.assign(self.whole())


class _HostCopy(trackable.Trackable):
    """The host copy of a `WholeTensor` that TF's asynchronous writer saves."""

    def __init__(self, variable: tf.Variable) -> None:
        self.variable = variable

    def _serialize_to_tensors(self) -> dict[str, tf.Tensor]:
        return {_KEY: self.variable.read_value()}
